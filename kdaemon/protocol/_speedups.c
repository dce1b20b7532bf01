/*
 * Optional accelerator for the RecordBatch v2 record loop.
 *
 * decode_v2_records() is a drop-in replacement for record_loop.python_loop (the RecordLoop contract): same arguments,
 * same results, same errors (ValueError for malformed input, which the caller turns into
 * CorruptRecordError).  The pure-Python function stays the reference; the test suite runs
 * both over the same batches and compares.  Every read is bounds-checked against the record's
 * own length, so corrupt input cannot read outside the buffer.
 *
 * Header filters: a Python callable is called with the header list.  A HeaderMatch rule list
 * (see header_match.py) is evaluated here without calling back into Python: rules are tuples
 * (kind, key_bytes, values_frozenset_or_prefix, keep) applied in order, first match decides.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyTypeObject *record_type = NULL;

static int
read_uvarint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int max_bytes, uint64_t *out)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= end) {
            PyErr_Format(PyExc_ValueError, "varint runs past the end of the record at %zd", p);
            return -1;
        }
        uint8_t b = buf[p++];
        /* The tenth byte of a varlong holds only bit 63: anything more does not fit in 64 bits
         * (the shift would silently drop it), as decode_uvarint in primitives.py reports. */
        if (shift == 63 && b > 1) {
            PyErr_Format(PyExc_ValueError, "varlong exceeds 64 bits at %zd", *pos);
            return -1;
        }
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *pos = p;
            *out = result;
            return 0;
        }
        shift += 7;
    }
    PyErr_Format(PyExc_ValueError, "varint longer than %d bytes at %zd", max_bytes, *pos);
    return -1;
}

static inline int
read_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    Py_ssize_t p = *pos;
    if (p < end && buf[p] < 0x80) {
        uint8_t b = buf[p];
        *out = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        *pos = p + 1;
        return 0;
    }
    uint64_t raw;
    if (read_uvarint(buf, pos, end, 5, &raw) < 0)
        return -1;
    if (raw >> 32) {
        PyErr_SetString(PyExc_ValueError, "varint exceeds 32 bits");
        return -1;
    }
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

static inline int
read_varlong(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    uint64_t raw;
    if (read_uvarint(buf, pos, end, 10, &raw) < 0)
        return -1;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

/* Native header rules.  Each rule: (kind:int, key:bytes, arg, keep:bool).
 * kinds: 0 equals-any-of (arg: tuple or frozenset of bytes), 1 exists, 2 missing,
 * 3 prefix (arg: bytes).
 * Returns 1 keep, 0 drop, -1 error.  No rule matching -> default_keep. */
typedef struct {
    const uint8_t *key;
    Py_ssize_t key_len;
    const uint8_t *value;   /* NULL for a null value */
    Py_ssize_t value_len;
} raw_header;

#define INLINE_HEADERS 32

/* A header key must be UTF-8 whether or not the record is kept: the Python loop decodes every
 * key to str before the filter runs, so the native path, which never builds the str of a
 * dropped record, checks it here to reject the same records (ASCII costs one pass). */
static int
check_utf8(const uint8_t *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] >= 0x80) {
            PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
            if (s == NULL)
                return -1;
            Py_DECREF(s);
            return 0;
        }
    }
    return 0;
}

static int
eval_rules(PyObject *rules, int default_keep, raw_header *hs, Py_ssize_t nh)
{
    Py_ssize_t nrules = PyTuple_GET_SIZE(rules);
    for (Py_ssize_t r = 0; r < nrules; r++) {
        PyObject *rule = PyTuple_GET_ITEM(rules, r);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(rule, 0));
        PyObject *key = PyTuple_GET_ITEM(rule, 1);
        PyObject *arg = PyTuple_GET_ITEM(rule, 2);
        int keep = PyObject_IsTrue(PyTuple_GET_ITEM(rule, 3));
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t klen = PyBytes_GET_SIZE(key);
        /* The last header with the key wins, as in Kafka's Headers.lastHeader(). */
        Py_ssize_t found = -1;
        for (Py_ssize_t i = nh - 1; i >= 0; i--) {
            if (hs[i].key_len == klen && memcmp(hs[i].key, k, klen) == 0) {
                found = i;
                break;
            }
        }
        int matched = 0;
        if (kind == 1) {
            matched = found >= 0;
        } else if (kind == 2) {
            matched = found < 0;
        } else if (found >= 0 && hs[found].value != NULL) {
            if (kind == 0 && PyTuple_Check(arg)) {
                /* Small sets: a linear memcmp beats building a bytes object to hash. */
                Py_ssize_t n = PyTuple_GET_SIZE(arg);
                for (Py_ssize_t j = 0; j < n && !matched; j++) {
                    PyObject *cand = PyTuple_GET_ITEM(arg, j);
                    matched = PyBytes_GET_SIZE(cand) == hs[found].value_len &&
                              memcmp(PyBytes_AS_STRING(cand), hs[found].value, hs[found].value_len) == 0;
                }
            } else if (kind == 0) {
                PyObject *v = PyBytes_FromStringAndSize((const char *)hs[found].value, hs[found].value_len);
                if (v == NULL)
                    return -1;
                int c = PySet_Contains(arg, v);
                Py_DECREF(v);
                if (c < 0)
                    return -1;
                matched = c;
            } else if (kind == 3) {
                Py_ssize_t plen = PyBytes_GET_SIZE(arg);
                matched = hs[found].value_len >= plen &&
                          memcmp(hs[found].value, PyBytes_AS_STRING(arg), plen) == 0;
            }
        }
        if (matched)
            return keep;
    }
    return default_keep;
}

/* a + b as a Python int, for the rare sum that does not fit in 64 bits. */
static PyObject *
sum_as_pylong(long long a, long long b)
{
    PyObject *pa = PyLong_FromLongLong(a), *pb = PyLong_FromLongLong(b), *sum = NULL;
    if (pa != NULL && pb != NULL)
        sum = PyNumber_Add(pa, pb);
    Py_XDECREF(pa);
    Py_XDECREF(pb);
    return sum;
}

static PyObject *
configure(PyObject *self, PyObject *arg)
{
    if (!PyType_Check(arg) || !PyType_IsSubtype((PyTypeObject *)arg, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure() needs the ConsumerRecord tuple subclass");
        return NULL;
    }
    Py_XDECREF(record_type);
    Py_INCREF(arg);
    record_type = (PyTypeObject *)arg;
    Py_RETURN_NONE;
}

/* decode_v2_records(buf, pos, count, base_offset, base_timestamp, log_append_time,
 *                   timestamp_type, leader_epoch, topic, partition, min_offset,
 *                   header_filter, out) -> (pos, filtered)
 * header_filter: None, a callable(headers) -> bool, or a tuple (rules, default_keep) of
 * native rules. */
static PyObject *
decode_v2_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "decode_v2_records takes 13 arguments");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.configure() was not called");
        return NULL;
    }
    PyObject *bufobj = args[0];
    if (!PyBytes_Check(bufobj)) {
        PyErr_SetString(PyExc_TypeError, "buf must be bytes");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)PyBytes_AS_STRING(bufobj);
    Py_ssize_t end = PyBytes_GET_SIZE(bufobj);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    long long base_offset = PyLong_AsLongLong(args[3]);
    long long base_timestamp = PyLong_AsLongLong(args[4]);
    PyObject *log_append_obj = args[5];
    PyObject *ts_type = args[6];
    PyObject *leader_epoch = args[7];
    PyObject *topic = args[8];
    PyObject *partition = args[9];
    long long min_offset = PyLong_AsLongLong(args[10]);
    PyObject *filter = args[11];
    PyObject *out = args[12];
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    int has_log_append = log_append_obj != Py_None;
    long long log_append = has_log_append ? PyLong_AsLongLong(log_append_obj) : 0;
    if (PyErr_Occurred())
        return NULL;

    PyObject *rules = NULL;
    int default_keep = 1;
    PyObject *callable = NULL;
    if (PyTuple_Check(filter) && PyTuple_GET_SIZE(filter) == 2) {
        rules = PyTuple_GET_ITEM(filter, 0);
        default_keep = PyObject_IsTrue(PyTuple_GET_ITEM(filter, 1));
        if (!PyTuple_Check(rules)) {
            PyErr_SetString(PyExc_TypeError, "native header rules must be a tuple");
            return NULL;
        }
    } else if (filter != Py_None) {
        callable = filter;
    }

    Py_ssize_t filtered = 0;
    raw_header inline_hs[INLINE_HEADERS];
    raw_header *hs = inline_hs;
    Py_ssize_t hs_cap = INLINE_HEADERS;
    PyObject *result = NULL;
    int check_offsets = base_offset < min_offset;

    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, key_len, value_len, n_headers;
        if (read_varint(buf, &pos, end, &length) < 0)
            goto done;
        if (length < 0 || length > end - pos) {
            PyErr_Format(PyExc_ValueError, "record length %lld runs past the payload", (long long)length);
            goto done;
        }
        Py_ssize_t rend = pos + (Py_ssize_t)length;
        if (pos >= rend) {
            PyErr_SetString(PyExc_ValueError, "record has no attributes byte");
            goto done;
        }
        pos += 1; /* attributes */
        if (read_varlong(buf, &pos, rend, &ts_delta) < 0 ||
            read_varint(buf, &pos, rend, &offset_delta) < 0 ||
            read_varint(buf, &pos, rend, &key_len) < 0)
            goto done;
        if (key_len < -1 || key_len > rend - pos) {
            PyErr_Format(PyExc_ValueError, "key length %lld invalid", (long long)key_len);
            goto done;
        }
        Py_ssize_t key_pos = pos;
        if (key_len > 0)
            pos += key_len;
        if (read_varint(buf, &pos, rend, &value_len) < 0)
            goto done;
        if (value_len < -1 || value_len > rend - pos) {
            PyErr_Format(PyExc_ValueError, "value length %lld invalid", (long long)value_len);
            goto done;
        }
        Py_ssize_t value_pos = pos;
        if (value_len > 0)
            pos += value_len;
        if (read_varint(buf, &pos, rend, &n_headers) < 0)
            goto done;
        if (n_headers < 0 || n_headers > rend - pos) {
            PyErr_Format(PyExc_ValueError, "header count %lld invalid", (long long)n_headers);
            goto done;
        }
        /* A sum outside 64 bits is what the Python loop computes too (its ints are unbounded):
         * such a record is built with Python ints, and compares with min_offset by its sign. */
        long long offset, timestamp;
        int offset_overflow = __builtin_add_overflow(base_offset, (long long)offset_delta, &offset);
        int ts_overflow = __builtin_add_overflow(base_timestamp, (long long)ts_delta, &timestamp);
        int before_position = check_offsets && (offset_overflow ? offset_delta < 0 : offset < min_offset);

        /* Native rules: walk raw headers, decide, and build Python objects only if kept. */
        if (rules != NULL) {
            if (n_headers > hs_cap) {
                raw_header *grown = PyMem_Malloc(sizeof(raw_header) * (size_t)n_headers);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                if (hs != inline_hs)
                    PyMem_Free(hs);
                hs = grown;
                hs_cap = (Py_ssize_t)n_headers;
            }
            Py_ssize_t hp = pos;
            for (int64_t h = 0; h < n_headers; h++) {
                int64_t hk, hv;
                if (read_varint(buf, &hp, rend, &hk) < 0)
                    goto done;
                if (hk < 0 || hk > rend - hp) {
                    PyErr_SetString(PyExc_ValueError, "header key length invalid");
                    goto done;
                }
                if (check_utf8(buf + hp, (Py_ssize_t)hk) < 0)
                    goto done;
                hs[h].key = buf + hp;
                hs[h].key_len = hk;
                hp += hk;
                if (read_varint(buf, &hp, rend, &hv) < 0)
                    goto done;
                if (hv < -1 || hv > rend - hp) {
                    PyErr_SetString(PyExc_ValueError, "header value length invalid");
                    goto done;
                }
                hs[h].value = hv < 0 ? NULL : buf + hp;
                hs[h].value_len = hv < 0 ? 0 : hv;
                if (hv > 0)
                    hp += hv;
            }
            if (hp != rend) {
                PyErr_Format(PyExc_ValueError, "record length says %lld bytes, fields take %lld",
                             (long long)length, (long long)(length + hp - rend));
                goto done;
            }
            if (before_position) {
                pos = rend;
                continue;
            }
            int keep = eval_rules(rules, default_keep, hs, (Py_ssize_t)n_headers);
            if (keep < 0)
                goto done;
            if (!keep) {
                filtered++;
                pos = rend;
                continue;
            }
        }

        PyObject *headers = PyList_New((Py_ssize_t)n_headers);
        if (headers == NULL)
            goto done;
        for (int64_t h = 0; h < n_headers; h++) {
            int64_t hk, hv;
            if (read_varint(buf, &pos, rend, &hk) < 0)
                goto fail_headers;
            if (hk < 0 || hk > rend - pos) {
                PyErr_SetString(PyExc_ValueError, "header key length invalid");
                goto fail_headers;
            }
            PyObject *k = PyUnicode_DecodeUTF8((const char *)buf + pos, (Py_ssize_t)hk, "strict");
            if (k == NULL)
                goto fail_headers;
            pos += hk;
            if (read_varint(buf, &pos, rend, &hv) < 0 || hv < -1 || hv > rend - pos) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "header value length invalid");
                Py_DECREF(k);
                goto fail_headers;
            }
            PyObject *v;
            if (hv < 0) {
                v = Py_None;
                Py_INCREF(v);
            } else {
                v = PyBytes_FromStringAndSize((const char *)buf + pos, (Py_ssize_t)hv);
                pos += hv;
            }
            if (v == NULL) {
                Py_DECREF(k);
                goto fail_headers;
            }
            PyObject *pair = PyTuple_Pack(2, k, v);
            Py_DECREF(k);
            Py_DECREF(v);
            if (pair == NULL)
                goto fail_headers;
            PyList_SET_ITEM(headers, (Py_ssize_t)h, pair);
        }
        if (pos != rend) {
            PyErr_Format(PyExc_ValueError, "record length says %lld bytes, fields take %lld",
                         (long long)length, (long long)(length + pos - rend));
            goto fail_headers;
        }
        if (before_position) {
            Py_DECREF(headers);
            continue;
        }
        if (callable != NULL) {
            PyObject *res = PyObject_CallOneArg(callable, headers);
            if (res == NULL)
                goto fail_headers;
            int keep = PyObject_IsTrue(res);
            Py_DECREF(res);
            if (keep < 0)
                goto fail_headers;
            if (!keep) {
                filtered++;
                Py_DECREF(headers);
                continue;
            }
        }
        {
            PyObject *rec = record_type->tp_alloc(record_type, 9);
            if (rec == NULL)
                goto fail_headers;
            PyObject *o_offset = offset_overflow ? sum_as_pylong(base_offset, offset_delta)
                                                 : PyLong_FromLongLong(offset);
            PyObject *o_ts = has_log_append ? PyLong_FromLongLong(log_append)
                             : ts_overflow ? sum_as_pylong(base_timestamp, ts_delta)
                                           : PyLong_FromLongLong(timestamp);
            PyObject *o_key, *o_value;
            if (key_len < 0) {
                o_key = Py_None;
                Py_INCREF(o_key);
            } else {
                o_key = PyBytes_FromStringAndSize((const char *)buf + key_pos, (Py_ssize_t)key_len);
            }
            if (value_len < 0) {
                o_value = Py_None;
                Py_INCREF(o_value);
            } else {
                o_value = PyBytes_FromStringAndSize((const char *)buf + value_pos, (Py_ssize_t)value_len);
            }
            Py_INCREF(topic);
            Py_INCREF(partition);
            Py_INCREF(ts_type);
            Py_INCREF(leader_epoch);
            PyTuple_SET_ITEM(rec, 0, topic);
            PyTuple_SET_ITEM(rec, 1, partition);
            PyTuple_SET_ITEM(rec, 2, o_offset);
            PyTuple_SET_ITEM(rec, 3, o_ts);
            PyTuple_SET_ITEM(rec, 4, ts_type);
            PyTuple_SET_ITEM(rec, 5, o_key);
            PyTuple_SET_ITEM(rec, 6, o_value);
            PyTuple_SET_ITEM(rec, 7, headers);
            PyTuple_SET_ITEM(rec, 8, leader_epoch);
            if (!o_offset || !o_ts || !o_key || !o_value) {
                Py_DECREF(rec);
                goto done;
            }
            int rc = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (rc < 0)
                goto done;
        }
        continue;
    fail_headers:
        Py_DECREF(headers);
        goto done;
    }
    result = Py_BuildValue("(nn)", pos, filtered);
done:
    if (hs != inline_hs)
        PyMem_Free(hs);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O, "Set the record type built by decode_v2_records."},
    {"decode_v2_records", (PyCFunction)(void (*)(void))decode_v2_records, METH_FASTCALL,
     "Decode the records of one v2 batch payload (see record_loop.RecordLoop)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kdaemon.protocol._speedups", "Optional C record decoder.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
