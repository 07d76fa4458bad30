/*
 * headrace._speedups: the per-record walks of the produce path and of the Spark
 * decoder in C (issue 24).
 *
 * records_ok(data, count, base_timestamp, lo, hi, flags) -> bool
 *
 * True when ``data`` (one batch's uncompressed records block) holds exactly ``count``
 * records framed as Kafka's DefaultRecord.readFrom reads them and every record passes the
 * checks ``flags`` asks for:
 *   CHECK_OFFSETS (1)  record i's offset delta is i;
 *   CHECK_TIMES   (2)  base_timestamp + timestamp delta (int64, wrapping) is -1 or within
 *                      [lo, hi];
 *   REQUIRE_KEYS  (4)  no record has a null key (a compacted topic).
 * False on anything else; the caller then runs the numpy path of
 * headrace/log/validator.py, which finds and words the error. So this function only has
 * to be at least as strict as that path (tests/unit/test_speedups.py checks it against it
 * on fuzzed batches), never more lenient.
 *
 * Every read is bounded by the end of the record being read (and the record by the end of
 * ``data``) before it happens; nothing is allocated; the GIL is released while scanning.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CHECK_OFFSETS 1
#define CHECK_TIMES 2
#define REQUIRE_KEYS 4

/* A zigzag varint of at most max_bytes bytes at *pos, every byte before end. The value is
 * the one numpy's records.varints gives: bits past 64 dropped, as Java's readVarlong. */
static inline int
read_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int max_bytes, int64_t *out)
{
    uint64_t raw = 0;
    Py_ssize_t p = *pos;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= end)
            return 0;
        uint8_t b = buf[p++];
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *pos = p;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 1;
        }
    }
    return 0;
}

/* Skips n bytes at *pos if 0 <= n and they end by end. */
static inline int
skip(Py_ssize_t *pos, Py_ssize_t end, int64_t n)
{
    if (n < 0 || n > (int64_t)(end - *pos))
        return 0;
    *pos += (Py_ssize_t)n;
    return 1;
}

static int
scan(const uint8_t *buf, Py_ssize_t n, int64_t count, int64_t base, int64_t lo, int64_t hi,
     long flags)
{
    Py_ssize_t pos = 0;
    if (count < 1)
        return 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t length, ts, off, klen, vlen, hcount;
        /* (a record shorter than 6 bytes fails below: no room for its six fields) */
        if (!read_varint(buf, &pos, n, 5, &length) || length > (int64_t)(n - pos))
            return 0;
        Py_ssize_t end = pos + (Py_ssize_t)length;
        Py_ssize_t p = pos + 1; /* the attributes byte */
        if (!read_varint(buf, &p, end, 10, &ts) || !read_varint(buf, &p, end, 5, &off))
            return 0;
        if ((flags & CHECK_OFFSETS) && off != i)
            return 0;
        if (!read_varint(buf, &p, end, 5, &klen))
            return 0;
        /* a negative length is a null key or value; a field must follow each (the next
         * read fails at the record's end) */
        if (klen >= 0 ? !skip(&p, end, klen) : (flags & REQUIRE_KEYS) != 0)
            return 0;
        if (!read_varint(buf, &p, end, 5, &vlen) || (vlen >= 0 && !skip(&p, end, vlen)))
            return 0;
        if (!read_varint(buf, &p, end, 5, &hcount) || hcount < 0)
            return 0;
        for (int64_t h = 0; h < hcount; h++) {
            /* each header takes at least two bytes: a bogus count fails within the record */
            int64_t hk, hv;
            if (!read_varint(buf, &p, end, 5, &hk) || !skip(&p, end, hk)) /* no null key */
                return 0;
            if (!read_varint(buf, &p, end, 5, &hv))
                return 0;
            if (hv >= 0 && !skip(&p, end, hv))
                return 0;
        }
        if (p != end)
            return 0;
        if (flags & CHECK_TIMES) {
            int64_t stamp = (int64_t)((uint64_t)base + (uint64_t)ts);
            if (stamp != -1 && (stamp < lo || stamp > hi))
                return 0;
        }
        pos = end;
    }
    return pos == n;
}

static PyObject *
records_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "records_ok(data, count, base_timestamp, lo, hi, flags)");
        return NULL;
    }
    int64_t vals[4];
    for (int i = 0; i < 4; i++) {
        vals[i] = PyLong_AsLongLong(args[i + 1]);
        if (vals[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    long flags = PyLong_AsLong(args[5]);
    if (flags == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = scan((const uint8_t *)view.buf, view.len, vals[0], vals[1], vals[2], vals[3], flags);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* record_fields(data, count, end, ts_delta, off_delta, key_pos, key_len, value_pos,
 *               value_len, header_pos) -> bool
 *
 * The Spark decoder's walk (headrace/spark/batch_decode.py): ``count`` records back to back
 * from the start of ``data``, ending exactly at ``end`` (<= len(data)); each record's
 * timestamp and offset deltas, the position and length of its key and value (a negative
 * length: null) and the position of its header count are written to the nine int64 arrays
 * (writable buffers of at least ``count`` items). False when the records are not laid out
 * so (the caller's numpy path then says what is wrong); nothing is written past the
 * arrays, nothing is read past ``end``. */
static int
fields(const uint8_t *buf, Py_ssize_t n, int64_t count, int64_t **out)
{
    Py_ssize_t pos = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t length, ts, off, klen, vlen;
        if (!read_varint(buf, &pos, n, 5, &length) || length < 0 || length > (int64_t)(n - pos))
            return 0;
        Py_ssize_t end = pos + (Py_ssize_t)length;
        Py_ssize_t p = pos + 1; /* the attributes byte */
        if (!read_varint(buf, &p, end, 10, &ts) || !read_varint(buf, &p, end, 10, &off)
            || !read_varint(buf, &p, end, 10, &klen))
            return 0;
        Py_ssize_t kpos = p;
        if (klen >= 0 && !skip(&p, end, klen))
            return 0;
        if (!read_varint(buf, &p, end, 10, &vlen))
            return 0;
        Py_ssize_t vpos = p;
        if (vlen >= 0 && !skip(&p, end, vlen))
            return 0;
        if (p >= end) /* the header count must follow */
            return 0;
        out[0][i] = ts;
        out[1][i] = off;
        out[2][i] = kpos;
        out[3][i] = klen; /* negative: null */
        out[4][i] = vpos;
        out[5][i] = vlen;
        out[6][i] = p;
        pos = end;
    }
    return pos == n;
}

#define N_FIELDS 7

static PyObject *
record_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 + N_FIELDS) {
        PyErr_SetString(PyExc_TypeError,
                        "record_fields(data, count, end, ts_delta, off_delta, key_pos, "
                        "key_len, value_pos, value_len, header_pos)");
        return NULL;
    }
    int64_t count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer data;
    Py_buffer outs[N_FIELDS];
    int64_t *ptrs[N_FIELDS];
    int got = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (count < 0 || end < 0 || end > data.len) {
        PyErr_SetString(PyExc_ValueError, "count and end must be within the data");
        goto done;
    }
    for (; got < N_FIELDS; got++) {
        if (PyObject_GetBuffer(args[3 + got], &outs[got], PyBUF_WRITABLE) < 0)
            goto done;
        if (outs[got].len / (Py_ssize_t)sizeof(int64_t) < count
            || ((uintptr_t)outs[got].buf % sizeof(int64_t)) != 0) {
            got++;
            PyErr_SetString(PyExc_ValueError, "each output needs count aligned int64 items");
            goto done;
        }
        ptrs[got] = (int64_t *)outs[got].buf;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = fields((const uint8_t *)data.buf, end, count, ptrs);
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(ok);
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&outs[i]);
    PyBuffer_Release(&data);
    return result;
}

/* binary_column(data, pos, length) -> (offsets, values, validity, null_count) | None
 *
 * An Arrow ``binary`` array's buffers for the slices data[pos[i] : pos[i] + length[i]]
 * (length < 0: null), pos and length int64 buffers of one size: int32 offsets (n + 1),
 * the values back to back, and the validity bitmap (None when nothing is null). None when
 * a slice runs past ``data`` or the values pass 2 GiB (the caller's numpy path then
 * says so or uses large offsets). */
static PyObject *
binary_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "binary_column(data, pos, length)");
        return NULL;
    }
    Py_buffer data, pos_b, len_b;
    PyObject *result = NULL, *offsets = NULL, *values = NULL, *validity = NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &pos_b, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &len_b, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&pos_b);
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_ssize_t n = pos_b.len / (Py_ssize_t)sizeof(int64_t);
    if (len_b.len != pos_b.len || pos_b.len % (Py_ssize_t)sizeof(int64_t) != 0
        || ((uintptr_t)pos_b.buf % sizeof(int64_t)) != 0
        || ((uintptr_t)len_b.buf % sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "pos and length: int64 buffers of one size");
        goto done;
    }
    const int64_t *pos = (const int64_t *)pos_b.buf, *len = (const int64_t *)len_b.buf;
    int64_t total = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (len[i] < 0) {
            nulls++;
            continue;
        }
        if (pos[i] < 0 || pos[i] > data.len || len[i] > data.len - pos[i])
            goto none;
        total += len[i];
        if (total > INT32_MAX)
            goto none;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (offsets == NULL || values == NULL)
        goto done;
    uint8_t *bits = NULL;
    if (nulls) {
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (validity == NULL)
            goto done;
        bits = (uint8_t *)PyBytes_AS_STRING(validity);
        memset(bits, 0, (size_t)((n + 7) / 8));
    }
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    char *out = PyBytes_AS_STRING(values);
    const char *src = (const char *)data.buf;
    Py_BEGIN_ALLOW_THREADS
    int32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        off[i] = at;
        if (len[i] < 0)
            continue;
        if (bits)
            bits[i >> 3] |= (uint8_t)(1u << (i & 7));
        memcpy(out + at, src + pos[i], (size_t)len[i]);
        at += (int32_t)len[i];
    }
    off[n] = at;
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OOOL)", offsets, values, validity ? validity : Py_None,
                           (long long)nulls);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(values);
    Py_XDECREF(validity);
    PyBuffer_Release(&len_b);
    PyBuffer_Release(&pos_b);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"binary_column", (PyCFunction)(void (*)(void))binary_column, METH_FASTCALL,
     "binary_column(data, pos, length) -> (offsets, values, validity, null_count) | None: "
     "an Arrow binary array's buffers for slices of data."},
    {"record_fields", (PyCFunction)(void (*)(void))record_fields, METH_FASTCALL,
     "record_fields(data, count, end, ts_delta, off_delta, key_pos, key_len, value_pos, "
     "value_len, header_pos) -> bool: the fields of count records back to back, into "
     "int64 arrays."},
    {"records_ok", (PyCFunction)(void (*)(void))records_ok, METH_FASTCALL,
     "records_ok(data, count, base_timestamp, lo, hi, flags) -> bool: every record of an "
     "uncompressed records block well framed and passing the flags' checks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "headrace._speedups",
    "The produce path's per-record check in C (see records_ok).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "CHECK_OFFSETS", CHECK_OFFSETS) < 0
        || PyModule_AddIntConstant(m, "CHECK_TIMES", CHECK_TIMES) < 0
        || PyModule_AddIntConstant(m, "REQUIRE_KEYS", REQUIRE_KEYS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
