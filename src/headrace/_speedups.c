/*
 * headrace._speedups: the produce path's per-record check in C (issue 24).
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

static PyMethodDef methods[] = {
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
