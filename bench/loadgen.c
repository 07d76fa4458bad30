/*
 * loadgen: a load generator in C on librdkafka, so that the client is not the limit of a
 * benchmark (a Python produce loop tops out near 300k records/s on this machine).
 * Built by bench/setup.sh against Debian's librdkafka-dev into bench/build/loadgen.
 *
 *   loadgen -P -b HOST:PORT -t TOPIC [-p PARTITIONS] [-s SIZE] [-n COUNT] [-r RATE] [-X key=value]...
 *   loadgen -C -b HOST:PORT -t TOPIC [-p PARTITIONS] [-n COUNT] [-T SECONDS] [-X key=value]...
 *   loadgen -P -x PER_TXN -b HOST:PORT -t TOPIC [-p PARTITIONS] [-s SIZE] [-n COUNT] ...
 *   loadgen -O -b HOST:PORT -t TOPIC [-p PARTITIONS] [-n COMMITS] [-a IN_FLIGHT] ...
 *
 * -P produces COUNT records of SIZE bytes round-robin over PARTITIONS partitions and
 * waits for every delivery report; with -r, RATE records per second on a fixed schedule
 * (a latency measurement: one record is sent and delivered first, for the connection and
 * metadata, and not counted), waiting for the next send inside rd_kafka_poll so that
 * delivery reports are timed as they arrive; -C reads COUNT records from the beginning of all
 * PARTITIONS partitions (assigned, no group). -X passes any librdkafka property. -T caps
 * the run (default 300 s). One JSON line on stdout: records, seconds, records/s, MB/s,
 * failures, delivery latency percentiles (produce) and the generator's own CPU.
 * -x makes -P transactional (a transactional.id of its own unless -X gives one): each
 * transaction produces PER_TXN records round-robin and commits, the next begins when the
 * commit returned; the percentiles are then of whole transactions (begin to commit).
 * -O commits offsets as an assign()-mode consumer of a group of its own (generation -1):
 * COMMITS commits of one partition's offset each (round-robin over PARTITIONS, ever
 * larger), synchronously, or with -a asynchronously with at most IN_FLIGHT unanswered;
 * the percentiles are of each commit's round trip.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "loadgen: %s: %s\n", what, why);
    exit(2);
}

/* produce state, touched only from delivery reports (called inside rd_kafka_poll/flush) */
static uint64_t *sent_at;  /* send time of record i, ns */
static uint32_t *latency_us;
static long delivered, failed;
static int txn_mode; /* -x: delivery reports only count (latency_us holds transactions) */

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    uintptr_t i = (uintptr_t)m->_private;
    if (m->err) {
        failed++;
        return;
    }
    if (txn_mode) {
        delivered++;
        return;
    }
    uint64_t us = (now_ns() - sent_at[i]) / 1000;
    latency_us[delivered++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

/* offset commits (-O -a): answered commits, counted from the commit callback */
static long commits_answered, commits_failed;
static uint64_t *commit_sent_at;

static void on_commit(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque) {
    (void)rk;
    (void)opaque;
    if (err || !offsets || offsets->cnt < 1 || offsets->elems[0].err) {
        commits_failed++;
        return;
    }
    /* the offset says which commit this was: commit i sets offset i + 1 */
    long i = (long)offsets->elems[0].offset - 1;
    if (i < 0) return; /* the first commit, before the clock */
    uint64_t us = (now_ns() - commit_sent_at[i]) / 1000;
    latency_us[commits_answered++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct_ms(long n, double q) {
    if (n == 0) return -1;
    long i = (long)(q * (double)n);
    if (i >= n) i = n - 1;
    return latency_us[i] / 1000.0;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof err) != RD_KAFKA_CONF_OK)
        die(key, err);
}

int main(int argc, char **argv) {
    int produce = -1, partitions = 1, size = 100, commits = 0, in_flight = 0;
    long count = 100000, per_txn = 0;
    double cap_s = 300, rate = 0;
    const char *brokers = NULL, *topic = NULL;
    char *extra[64];
    int n_extra = 0, opt;
    while ((opt = getopt(argc, argv, "PCOb:t:p:s:n:T:r:X:x:a:")) != -1) {
        switch (opt) {
        case 'P': produce = 1; break;
        case 'C': produce = 0; break;
        case 'O': produce = 0; commits = 1; break;
        case 'x': per_txn = atol(optarg); break;
        case 'a': in_flight = atoi(optarg); break;
        case 'b': brokers = optarg; break;
        case 't': topic = optarg; break;
        case 'p': partitions = atoi(optarg); break;
        case 's': size = atoi(optarg); break;
        case 'n': count = atol(optarg); break;
        case 'T': cap_s = atof(optarg); break;
        case 'r': rate = atof(optarg); break;
        case 'X':
            if (n_extra == 64) die("-X", "at most 64");
            extra[n_extra++] = optarg;
            break;
        default: die("usage", "loadgen -P|-C -b BROKERS -t TOPIC [-p N] [-s SIZE] [-n COUNT] [-T S] [-r RATE] [-X k=v]");
        }
    }
    if (produce < 0 || !brokers || !topic) die("usage", "need -P, -C or -O, -b and -t");
    if (partitions < 1 || size < 0 || count < 1 || rate < 0 || per_txn < 0 || in_flight < 0)
        die("usage", "bad -p, -s, -n, -r, -x or -a");
    if (per_txn && (!produce || rate > 0)) die("usage", "-x goes with -P and without -r");

    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", brokers);
    if (!produce) {
        char group[64];
        snprintf(group, sizeof group, "loadgen-%ld", (long)now_ns());
        set(conf, "group.id", group);
        set(conf, "enable.auto.commit", "false");
        set(conf, "enable.partition.eof", "false");
    }
    if (produce && per_txn) {
        char tid[64];
        snprintf(tid, sizeof tid, "loadgen-txn-%ld", (long)now_ns());
        set(conf, "transactional.id", tid);
    }
    for (int i = 0; i < n_extra; i++) {
        char *eq = strchr(extra[i], '=');
        if (!eq) die("-X", "expects key=value");
        *eq = '\0';
        set(conf, extra[i], eq + 1);
    }
    double cpu0 = cpu_seconds();
    uint64_t t0, t1;
    long done = 0;
    if (produce) {
        sent_at = malloc(sizeof *sent_at * (size_t)count);
        latency_us = malloc(sizeof *latency_us * (size_t)count);
        char *payload = malloc((size_t)size + 1);
        if (!sent_at || !latency_us || !payload) die("malloc", strerror(errno));
        for (int i = 0; i < size; i++) payload[i] = (char)('a' + i % 26);
        txn_mode = per_txn > 0;
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
        if (!rk) die("producer", err);
        if (per_txn) {
            rd_kafka_error_t *te = rd_kafka_init_transactions(rk, 30000);
            if (te) die("init_transactions", rd_kafka_error_string(te));
            uint64_t deadline = now_ns() + (uint64_t)(cap_s * 1e9);
            long txns = 0;
            t0 = now_ns();
            while (done < count && now_ns() < deadline) {
                uint64_t began = now_ns();
                if ((te = rd_kafka_begin_transaction(rk))) die("begin", rd_kafka_error_string(te));
                for (long k = 0; k < per_txn && done < count; k++, done++) {
                    sent_at[done] = began;
                    for (;;) {
                        rd_kafka_resp_err_t e = rd_kafka_producev(
                            rk, RD_KAFKA_V_TOPIC(topic),
                            RD_KAFKA_V_PARTITION((int32_t)(done % partitions)),
                            RD_KAFKA_V_VALUE(payload, (size_t)size),
                            RD_KAFKA_V_OPAQUE((void *)(uintptr_t)done), RD_KAFKA_V_END);
                        if (e == RD_KAFKA_RESP_ERR_NO_ERROR) break;
                        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) die("produce", rd_kafka_err2str(e));
                        rd_kafka_poll(rk, 1);
                    }
                }
                if ((te = rd_kafka_commit_transaction(rk, (int)(cap_s * 1000))))
                    die("commit_transaction", rd_kafka_error_string(te));
                uint64_t us = (now_ns() - began) / 1000;
                latency_us[txns++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
                rd_kafka_poll(rk, 0);
            }
            t1 = now_ns();
            long recs = delivered; /* counted by the delivery reports (txn_mode) */
            rd_kafka_destroy(rk);
            double s = (double)(t1 - t0) / 1e9;
            qsort(latency_us, (size_t)txns, sizeof *latency_us, cmp_u32);
            printf("{\"mode\": \"transactional produce\", \"records\": %ld, \"delivered\": %ld, "
                   "\"failed\": %ld, \"transactions\": %ld, \"per_txn\": %ld, \"seconds\": %.3f, "
                   "\"records_per_s\": %.0f, \"txns_per_s\": %.0f, \"txn_p50_ms\": %.2f, "
                   "\"txn_p99_ms\": %.2f, \"client_cpu\": %.2f}\n",
                   done, recs, failed, txns, per_txn, s, done / s, txns / s, pct_ms(txns, 0.5),
                   pct_ms(txns, 0.99), (cpu_seconds() - cpu0) / s);
            return failed || done < count ? 1 : 0;
        }
        if (rate > 0) { /* warm-up: connection and metadata before the clock, not counted */
            sent_at[0] = now_ns();
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
                RD_KAFKA_V_VALUE(payload, (size_t)size), RD_KAFKA_V_OPAQUE((void *)(uintptr_t)0),
                RD_KAFKA_V_END);
            if (e) die("produce", rd_kafka_err2str(e));
            rd_kafka_flush(rk, 30000);
            delivered = failed = 0;
        }
        uint64_t deadline = now_ns() + (uint64_t)(cap_s * 1e9);
        t0 = now_ns();
        for (long i = 0; i < count && now_ns() < deadline; i++) {
            if (rate > 0) { /* the fixed schedule: record i is due at t0 + i / rate */
                uint64_t due = t0 + (uint64_t)((double)i * 1e9 / rate);
                uint64_t now;
                while ((now = now_ns()) < due) {
                    /* at least 1 ms: rd_kafka_poll returns at the first event, so a
                     * delivery report is timed when it arrives; a send may be up to 1 ms
                     * late, and the schedule (absolute) catches up */
                    uint64_t left_ms = (due - now) / 1000000;
                    rd_kafka_poll(rk, left_ms > 1 ? (int)left_ms : 1);
                }
            }
            sent_at[i] = now_ns();
            for (;;) {
                rd_kafka_resp_err_t e = rd_kafka_producev(
                    rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION((int32_t)(i % partitions)),
                    RD_KAFKA_V_VALUE(payload, (size_t)size), RD_KAFKA_V_OPAQUE((void *)(uintptr_t)i),
                    RD_KAFKA_V_END);
                if (e == RD_KAFKA_RESP_ERR_NO_ERROR) break;
                if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) die("produce", rd_kafka_err2str(e));
                rd_kafka_poll(rk, 1);
            }
            done++;
            if (rate > 0 || (i & 1023) == 0) rd_kafka_poll(rk, 0);
        }
        rd_kafka_flush(rk, (int)(cap_s * 1000));
        t1 = now_ns();
        long outstanding = rd_kafka_outq_len(rk);
        rd_kafka_destroy(rk);
        double s = (double)(t1 - t0) / 1e9;
        qsort(latency_us, (size_t)delivered, sizeof *latency_us, cmp_u32);
        printf("{\"mode\": \"produce\", \"records\": %ld, \"delivered\": %ld, \"failed\": %ld, "
               "\"undelivered\": %ld, \"seconds\": %.3f, \"records_per_s\": %.0f, "
               "\"mb_per_s\": %.1f, \"p50_ms\": %.2f, \"p99_ms\": %.2f, \"p999_ms\": %.2f, "
               "\"client_cpu\": %.2f}\n",
               done, delivered, failed, outstanding, s, delivered / s,
               (double)delivered * size / s / 1e6, pct_ms(delivered, 0.5),
               pct_ms(delivered, 0.99), pct_ms(delivered, 0.999),
               (cpu_seconds() - cpu0) / s);
        return failed || outstanding || delivered < count ? 1 : 0;
    }
    if (commits) {
        commit_sent_at = malloc(sizeof *commit_sent_at * (size_t)count);
        latency_us = malloc(sizeof *latency_us * (size_t)count);
        if (!commit_sent_at || !latency_us) die("malloc", strerror(errno));
        if (in_flight) rd_kafka_conf_set_offset_commit_cb(conf, on_commit);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
        if (!rk) die("consumer", err);
        /* no poll_set_consumer: the commit callbacks stay on the main queue, where
         * rd_kafka_poll returns as soon as it served one (consumer_poll waits for a
         * message) */
        /* the first commit finds the coordinator: before the clock, not counted */
        rd_kafka_topic_partition_list_t *first = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(first, topic, 0)->offset = 0;
        rd_kafka_resp_err_t ce = rd_kafka_commit(rk, first, 0);
        rd_kafka_topic_partition_list_destroy(first);
        if (ce) die("first commit", rd_kafka_err2str(ce));
        rd_kafka_poll(rk, 0); /* its callback, if any, is not counted */
        commits_answered = commits_failed = 0;
        uint64_t deadline = now_ns() + (uint64_t)(cap_s * 1e9);
        long issued = 0, answered = 0;
        t0 = now_ns();
        while (issued < count && now_ns() < deadline) {
            if (in_flight && issued - commits_answered - commits_failed >= in_flight) {
                rd_kafka_poll(rk, 100);
                continue;
            }
            rd_kafka_topic_partition_list_t *o = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(o, topic, (int32_t)(issued % partitions))->offset =
                issued + 1;
            commit_sent_at[issued] = now_ns();
            ce = rd_kafka_commit(rk, o, in_flight ? 1 : 0);
            rd_kafka_topic_partition_list_destroy(o);
            if (!in_flight) {
                if (ce) {
                    commits_failed++;
                } else {
                    uint64_t us = (now_ns() - commit_sent_at[issued]) / 1000;
                    latency_us[answered++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
                }
            } else if (ce) {
                commits_failed++;
            }
            issued++;
        }
        while (in_flight && commits_answered + commits_failed < issued && now_ns() < deadline)
            rd_kafka_poll(rk, 100);
        t1 = now_ns();
        if (in_flight) answered = commits_answered;
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        double s = (double)(t1 - t0) / 1e9;
        qsort(latency_us, (size_t)answered, sizeof *latency_us, cmp_u32);
        printf("{\"mode\": \"offset commits\", \"in_flight\": %d, \"commits\": %ld, "
               "\"answered\": %ld, \"failed\": %ld, \"seconds\": %.3f, \"commits_per_s\": %.0f, "
               "\"p50_ms\": %.3f, \"p99_ms\": %.3f, \"client_cpu\": %.2f}\n",
               in_flight ? in_flight : 1, issued, answered, commits_failed, s, answered / s,
               pct_ms(answered, 0.5), pct_ms(answered, 0.99), (cpu_seconds() - cpu0) / s);
        return commits_failed || answered < issued ? 1 : 0;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) die("consumer", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *tps = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(tps, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_resp_err_t e = rd_kafka_assign(rk, tps);
    rd_kafka_topic_partition_list_destroy(tps);
    if (e) die("assign", rd_kafka_err2str(e));
    long errors = 0;
    double bytes = 0;
    uint64_t deadline = now_ns() + (uint64_t)(cap_s * 1e9);
    t0 = 0;
    while (done < count && now_ns() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        if (m->err) {
            errors++;
        } else {
            if (!t0) t0 = now_ns(); /* from the first record: connection set-up not counted */
            done++;
            bytes += (double)m->len;
        }
        rd_kafka_message_destroy(m);
    }
    t1 = now_ns();
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    double s = t0 ? (double)(t1 - t0) / 1e9 : 0;
    printf("{\"mode\": \"consume\", \"records\": %ld, \"errors\": %ld, \"seconds\": %.3f, "
           "\"records_per_s\": %.0f, \"mb_per_s\": %.1f, \"client_cpu\": %.2f}\n",
           done, errors, s, s > 0 ? done / s : 0, s > 0 ? bytes / s / 1e6 : 0,
           s > 0 ? (cpu_seconds() - cpu0) / s : 0);
    return done < count ? 1 : 0;
}
