/* The per-entry loops of reading stored entries (bascule.wire.entry.intact_prefix and
 * bascule.wire.messages.MessageEncoder.walk) in C: at a Python loop's ~1.3 us per entry they were
 * Subscribe's whole server cost. Same rules, same bytes out (tests hold them to the Python loops).
 *
 * Each function stops *before* the first entry it would not pass whole (torn, out of sequence,
 * bad CRC, bad lengths) and says so; the Python side then says why, in its own words, so the
 * rules for reporting damage live in one place.
 *
 * Entry layout (big-endian; bascule/wire/entry.py is the reference):
 *   0 offset int64, 8 timestamp int64, 16 leader epoch uint64, 24 body size uint32,
 *   28 CRC-32C uint32 over bytes 0-27 and the body, 32 body: key length int32 (-1 none), key,
 *   value length uint32, value, header block (uint16 count, ...).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 32
#define CRC_POSITION 28
#define EMPTY_BODY_SIZE 10

/* ---- CRC-32C (Castagnoli), as the crc32c package computes it ------------------------------ */

static uint32_t crc_table[8][256];

static void crc_init_table(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        crc_table[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
}

/* Slicing-by-8 over the raw (not inverted) state. */
static uint32_t crc_software(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= crc; /* little-endian hosts only: see crc_update */
        crc = crc_table[7][word & 0xFF] ^ crc_table[6][(word >> 8) & 0xFF] ^ crc_table[5][(word >> 16) & 0xFF]
            ^ crc_table[4][(word >> 24) & 0xFF] ^ crc_table[3][(word >> 32) & 0xFF]
            ^ crc_table[2][(word >> 40) & 0xFF] ^ crc_table[1][(word >> 48) & 0xFF] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

static uint32_t crc_bytewise(uint32_t crc, const unsigned char *p, size_t n) {
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42_PATH 1
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t state = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        state = __builtin_ia32_crc32di(state, word);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)state;
    while (n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#endif

static int use_sse42 = 0;
static int little_endian = 1;

static inline uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n) {
#ifdef HAVE_SSE42_PATH
    if (use_sse42)
        return crc_sse42(crc, p, n);
#endif
    return little_endian ? crc_software(crc, p, n) : crc_bytewise(crc, p, n);
}

/* The CRC an entry stores: over its header before the CRC field, then its body. */
static inline uint32_t entry_crc(const unsigned char *entry, size_t body_size) {
    uint32_t crc = crc_update(0xFFFFFFFFu, entry, CRC_POSITION);
    return ~crc_update(crc, entry + HEADER_SIZE, body_size);
}

/* ---- big-endian reads and varints ---------------------------------------------------------- */

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) | ((uint64_t)p[3] << 32)
         | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) | ((uint64_t)p[6] << 8) | (uint64_t)p[7];
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline size_t varint_size(uint64_t n) {
    size_t size = 1;
    while (n >= 128) {
        n >>= 7;
        size++;
    }
    return size;
}

static inline unsigned char *put_varint(unsigned char *out, uint64_t n) {
    while (n >= 128) {
        *out++ = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *out++ = (unsigned char)n;
    return out;
}

/* One whole, intact entry at `p` (with `left` bytes from it), numbered `expected`: its size, or 0. */
static inline size_t whole_entry(const unsigned char *p, size_t left, int64_t expected, int check_crc) {
    if (left < HEADER_SIZE)
        return 0;
    uint64_t body_size = be32(p + 24);
    if ((int64_t)be64(p) != expected || HEADER_SIZE + body_size > left || body_size < EMPTY_BODY_SIZE)
        return 0;
    if (check_crc && entry_crc(p, (size_t)body_size) != be32(p + CRC_POSITION))
        return 0;
    return HEADER_SIZE + (size_t)body_size;
}

/* intact_prefix(buf, first_offset, max_entries, check_crc) -> (length, count, stopped) */
static PyObject *intact_prefix(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long long first_offset;
    Py_ssize_t max_entries;
    int check_crc;
    if (!PyArg_ParseTuple(args, "y*Lnp", &buf, &first_offset, &max_entries, &check_crc))
        return NULL;
    const unsigned char *data = buf.buf;
    size_t size = (size_t)buf.len, position = 0;
    Py_ssize_t count = 0;
    int stopped = 0;
    Py_BEGIN_ALLOW_THREADS
    while (position < size && count < max_entries) {
        size_t entry_size = whole_entry(data + position, size - position, first_offset + count, check_crc);
        if (!entry_size) {
            stopped = 1;
            break;
        }
        position += entry_size;
        count++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("nnO", (Py_ssize_t)position, count, stopped ? Py_True : Py_False);
}

/* walked_entries(buf, check_crc) -> (entries, stopped): scan()'s (offset, leader epoch, timestamp,
 * start, end) of each whole, intact entry from the start of buf, in any offset order (a
 * follower's log checks the sequence), up to the first torn or damaged one. */
static PyObject *walked_entries(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int check_crc;
    if (!PyArg_ParseTuple(args, "y*p", &buf, &check_crc))
        return NULL;
    const unsigned char *data = buf.buf;
    size_t size = (size_t)buf.len, position = 0;
    int stopped = 0;
    PyObject *entries = PyList_New(0);
    if (!entries)
        goto fail;
    while (position < size) {
        const unsigned char *entry = data + position;
        uint64_t body_size = size - position >= HEADER_SIZE ? be32(entry + 24) : 0;
        if (size - position < HEADER_SIZE || HEADER_SIZE + body_size > size - position || body_size < EMPTY_BODY_SIZE
                || (check_crc && entry_crc(entry, (size_t)body_size) != be32(entry + CRC_POSITION))) {
            stopped = 1;
            break;
        }
        size_t end = position + HEADER_SIZE + (size_t)body_size;
        PyObject *walked = Py_BuildValue("LKLnn", (long long)be64(entry), (unsigned long long)be64(entry + 16),
                                         (long long)be64(entry + 8), (Py_ssize_t)position, (Py_ssize_t)end);
        if (!walked || PyList_Append(entries, walked) < 0) {
            Py_XDECREF(walked);
            goto fail;
        }
        Py_DECREF(walked);
        position = end;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("NO", entries, stopped ? Py_True : Py_False);

fail:
    Py_XDECREF(entries);
    PyBuffer_Release(&buf);
    return NULL;
}

/* ---- Subscribe's Messages ------------------------------------------------------------------ */

typedef struct {
    unsigned char *data;
    size_t size, capacity;
} Output;

static int reserve(Output *out, size_t more) {
    if (out->size + more <= out->capacity)
        return 0;
    size_t capacity = out->capacity ? out->capacity : 4096;
    while (capacity < out->size + more)
        capacity *= 2;
    unsigned char *data = PyMem_Realloc(out->data, capacity);
    if (!data) {
        PyErr_NoMemory();
        return -1;
    }
    out->data = data;
    out->capacity = capacity;
    return 0;
}

/* encode_messages(chunk, first_offset, max_entries, check_crc, shared_for)
 *   -> (length, count, stopped, framed)
 * framed: each entry's Liftbridge Message with its gRPC prefix, fields in the order
 * MessageEncoder.walk writes them: key (when not empty), offset, value, timestamp, then the
 * fields shared with neighbours, which shared_for(header_block, offset) returns as bytes. */
static PyObject *encode_messages(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long long first_offset;
    Py_ssize_t max_entries;
    int check_crc;
    PyObject *shared_for;
    if (!PyArg_ParseTuple(args, "y*LnpO", &buf, &first_offset, &max_entries, &check_crc, &shared_for))
        return NULL;
    const unsigned char *data = buf.buf;
    size_t size = (size_t)buf.len, position = 0;
    Py_ssize_t count = 0;
    int stopped = 0;
    Output out = {NULL, 0, 0};
    PyObject *shared = NULL; /* bytes: the fields of the last header block seen */
    const unsigned char *last_block = NULL;
    size_t last_block_size = 0;

    while (position < size && count < max_entries) {
        const unsigned char *entry = data + position;
        int64_t offset = first_offset + count;
        size_t entry_size = whole_entry(entry, size - position, offset, check_crc);
        if (!entry_size) {
            stopped = 1;
            break;
        }
        const unsigned char *body = entry + HEADER_SIZE, *end = entry + entry_size;
        size_t body_size = entry_size - HEADER_SIZE;
        int32_t key_length = (int32_t)be32(body);
        const unsigned char *key = NULL, *value;
        uint64_t value_length;
        if (key_length == -1) {
            value_length = be32(body + 4);
            value = body + 8;
        } else if (key_length >= 0 && (size_t)key_length <= body_size - EMPTY_BODY_SIZE) {
            key = body + 4;
            value_length = be32(body + 4 + key_length);
            value = body + 8 + key_length;
        } else {
            stopped = 1;
            break;
        }
        if ((uint64_t)(end - value) < value_length + 2) { /* the header block's count at least */
            stopped = 1;
            break;
        }
        const unsigned char *block = value + value_length;
        size_t block_size = (size_t)(end - block);
        if (!shared || block_size != last_block_size || memcmp(block, last_block, block_size) != 0) {
            PyObject *fields = PyObject_CallFunction(shared_for, "y#L", (const char *)block,
                                                     (Py_ssize_t)block_size, (long long)offset);
            if (!fields)
                goto fail;
            if (!PyBytes_Check(fields)) {
                Py_DECREF(fields);
                PyErr_SetString(PyExc_TypeError, "shared_for must return bytes");
                goto fail;
            }
            Py_XSETREF(shared, fields);
            last_block = block;
            last_block_size = block_size;
        }
        uint64_t timestamp = be64(entry + 8); /* an int64: negative ones as protobuf's 10-byte varint */
        size_t key_field = key && key_length > 0 ? 1 + varint_size((uint64_t)key_length) + (size_t)key_length : 0;
        size_t shared_size = (size_t)PyBytes_GET_SIZE(shared);
        size_t length = key_field + 1 + varint_size((uint64_t)offset) + 1 + varint_size(value_length)
                      + (size_t)value_length + 1 + varint_size(timestamp) + shared_size;
        if (length > 0xFFFFFFFFu) {
            stopped = 1; /* beyond a gRPC message's length prefix: let the Python side say so */
            break;
        }
        if (reserve(&out, 5 + length) < 0)
            goto fail;
        unsigned char *w = out.data + out.size;
        *w++ = 0;
        *w++ = (unsigned char)(length >> 24);
        *w++ = (unsigned char)(length >> 16);
        *w++ = (unsigned char)(length >> 8);
        *w++ = (unsigned char)length;
        if (key_field) {
            *w++ = 0x12;
            w = put_varint(w, (uint64_t)key_length);
            memcpy(w, key, (size_t)key_length);
            w += key_length;
        }
        *w++ = 0x08;
        w = put_varint(w, (uint64_t)offset);
        *w++ = 0x1a;
        w = put_varint(w, value_length);
        memcpy(w, value, (size_t)value_length);
        w += value_length;
        *w++ = 0x20;
        w = put_varint(w, timestamp);
        memcpy(w, PyBytes_AS_STRING(shared), shared_size);
        w += shared_size;
        out.size = (size_t)(w - out.data);
        position += entry_size;
        count++;
    }
    PyObject *framed = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.size);
    PyMem_Free(out.data);
    Py_XDECREF(shared);
    PyBuffer_Release(&buf);
    if (!framed)
        return NULL;
    return Py_BuildValue("nnON", (Py_ssize_t)position, count, stopped ? Py_True : Py_False, framed);

fail:
    PyMem_Free(out.data);
    Py_XDECREF(shared);
    PyBuffer_Release(&buf);
    return NULL;
}

/* ---- a leader's appends and acks ----------------------------------------------------------- */

static PyObject *name_value, *name_key, *name_headers, *name_timestamp, *name_header_block, *name_message_id,
    *no_headers;

static inline unsigned char *put_be32(unsigned char *out, uint32_t n) {
    out[0] = (unsigned char)(n >> 24);
    out[1] = (unsigned char)(n >> 16);
    out[2] = (unsigned char)(n >> 8);
    out[3] = (unsigned char)n;
    return out + 4;
}

static inline unsigned char *put_be64(unsigned char *out, uint64_t n) {
    put_be32(out, (uint32_t)(n >> 32));
    return put_be32(out + 4, (uint32_t)n);
}

/* entry.Record's slots, found once by name: records are read (encode_entries) and built
 * (capture_records) through them, without an attribute lookup or an __init__ call each, which were
 * most of a captured message's cost. Any other type of record is read by its attributes. */
static const char *record_slots[] = {"value", "key", "headers", "timestamp", "header_block"};
#define RECORD_SLOTS 5
static PyTypeObject *record_type;
static Py_ssize_t record_offsets[RECORD_SLOTS];
static PyObject *zero;

static int learn_record_type(PyObject *type) {
    if ((PyObject *)record_type == type)
        return 0;
    if (!PyType_Check(type))
        return PyErr_SetString(PyExc_TypeError, "record_type must be a type"), -1;
    PyObject *slots = PyObject_GetAttrString(type, "__slots__");
    if (!slots) {
        PyErr_Clear();
        return PyErr_SetString(PyExc_TypeError, "record_type's slots are not Record's"), -1;
    }
    PyObject *expected = Py_BuildValue("(sssss)", "value", "key", "headers", "timestamp", "header_block");
    int same = expected ? PyObject_RichCompareBool(slots, expected, Py_EQ) : -1;
    Py_DECREF(slots);
    Py_XDECREF(expected);
    if (same <= 0)
        return same < 0 ? -1 : (PyErr_SetString(PyExc_TypeError, "record_type's slots are not Record's"), -1);
    for (int i = 0; i < RECORD_SLOTS; i++) {
        PyObject *descriptor = PyObject_GetAttrString(type, record_slots[i]);
        if (!descriptor)
            return -1;
        int is_member = Py_IS_TYPE(descriptor, &PyMemberDescr_Type);
        if (is_member) {
            PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
            is_member = member->type == T_OBJECT_EX && !(member->flags & READONLY);
            record_offsets[i] = member->offset;
        }
        Py_DECREF(descriptor);
        if (!is_member)
            return PyErr_Format(PyExc_TypeError, "Record.%s is not a writable slot", record_slots[i]), -1;
    }
    Py_XSETREF(record_type, (PyTypeObject *)Py_NewRef(type));
    return 0;
}

/* A bytes-like object's memory: bytes directly, others through a buffer view held in `view`. */
static int view_of(PyObject *obj, Py_buffer *view, const char **data, Py_ssize_t *length) {
    if (PyBytes_CheckExact(obj)) {
        *data = PyBytes_AS_STRING(obj);
        *length = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    *data = view->buf;
    *length = view->len;
    return 0;
}

/* What encode_entries needs of one Record, holding references and buffers until released. */
typedef struct {
    PyObject *value, *key, *block;
    Py_buffer value_buf, key_buf, block_buf;
    const char *value_data, *key_data, *block_data;
    Py_ssize_t value_size, key_size, block_size;
    int has_key;
    long long timestamp;
} Fields;

static void release_fields(Fields *f) {
    if (f->value_buf.obj)
        PyBuffer_Release(&f->value_buf);
    if (f->key_buf.obj)
        PyBuffer_Release(&f->key_buf);
    if (f->block_buf.obj)
        PyBuffer_Release(&f->block_buf);
    Py_XDECREF(f->value);
    Py_XDECREF(f->key);
    Py_XDECREF(f->block);
}

/* New references to the record's value, key, header_block, timestamp and headers. */
static int read_slots(PyObject *record, PyObject **slots) {
    static PyObject **names[RECORD_SLOTS] = {&name_value, &name_key, &name_headers, &name_timestamp,
                                             &name_header_block};
    for (int i = 0; i < RECORD_SLOTS; i++) {
        if (Py_TYPE(record) == record_type) {
            PyObject *slot = *(PyObject **)((char *)record + record_offsets[i]);
            slots[i] = slot ? Py_NewRef(slot) : NULL;
            if (!slot)
                PyErr_Format(PyExc_AttributeError, "'Record' object has no attribute '%s'", record_slots[i]);
        } else {
            slots[i] = PyObject_GetAttr(record, *names[i]);
        }
        if (!slots[i]) {
            while (i--)
                Py_DECREF(slots[i]);
            return -1;
        }
    }
    return 0;
}

static int read_fields(PyObject *record, PyObject *encode_headers, Fields *f) {
    memset(f, 0, sizeof(*f));
    PyObject *slots[RECORD_SLOTS];
    if (read_slots(record, slots) < 0)
        return -1;
    f->value = slots[0];
    f->key = slots[1];
    PyObject *headers = slots[2], *stamp = slots[3];
    f->block = slots[4];
    f->timestamp = PyLong_AsLongLong(stamp);
    Py_DECREF(stamp);
    if (f->timestamp == -1 && PyErr_Occurred())
        goto fail;
    int has_block = PyObject_IsTrue(f->block);
    if (has_block < 0)
        goto fail;
    if (!has_block) { /* no shared encoding: the headers' own, as encode_headers makes it */
        Py_CLEAR(f->block);
        int any = PyObject_IsTrue(headers);
        if (any < 0)
            goto fail;
        f->block = any ? PyObject_CallOneArg(encode_headers, headers) : Py_NewRef(no_headers);
        if (!f->block)
            goto fail;
    }
    Py_CLEAR(headers);
    if (view_of(f->value, &f->value_buf, &f->value_data, &f->value_size) < 0
            || view_of(f->block, &f->block_buf, &f->block_data, &f->block_size) < 0)
        goto fail;
    if (f->key != Py_None) {
        if (view_of(f->key, &f->key_buf, &f->key_data, &f->key_size) < 0)
            goto fail;
        f->has_key = f->key_size > 0;
    }
    return 0;

fail:
    Py_XDECREF(headers);
    release_fields(f);
    return -1;
}

/* A new reference to the int n: `last` again when it already is n (neighbours share a timestamp,
 * and an entry's end is the next one's start). */
static PyObject *long_reusing(PyObject *last, long long n) {
    if (last) {
        long long was = PyLong_AsLongLong(last);
        if (was == n)
            return Py_NewRef(last);
    }
    return PyLong_FromLongLong(n);
}

/* encode_entries(records, first_offset, leader_epoch, timestamp, floor, encode_headers, record_type)
 *   -> (data, walked): entry.encode_entries' loop. A record's key is written when not empty (length
 * -1 for None, 0 for empty); its header_block when set, else encode_headers(headers), else no
 * headers. With a floor (not None), no timestamp goes below it or below the entry before. */
static PyObject *encode_entries(PyObject *self, PyObject *args) {
    PyObject *records, *encode_headers, *floor_arg, *type;
    long long first_offset, timestamp, floor = 0;
    unsigned long long leader_epoch;
    if (!PyArg_ParseTuple(args, "O!LKLOOO", &PyList_Type, &records, &first_offset, &leader_epoch, &timestamp,
                          &floor_arg, &encode_headers, &type))
        return NULL;
    int raising = floor_arg != Py_None;
    if (raising && (floor = PyLong_AsLongLong(floor_arg)) == -1 && PyErr_Occurred())
        return NULL;
    if (learn_record_type(type) < 0)
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(records);
    Output out = {NULL, 0, 0};
    PyObject *walked = PyList_New(count), *epoch = PyLong_FromUnsignedLongLong(leader_epoch);
    PyObject *last_stamp = NULL, *last_end = PyLong_FromLong(0);
    if (!walked || !epoch || !last_end)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        Fields f;
        if (read_fields(PyList_GET_ITEM(records, i), encode_headers, &f) < 0)
            goto fail;
        uint64_t value_size = (uint64_t)f.value_size, key_size = f.has_key ? (uint64_t)f.key_size : 0;
        uint64_t body_size = 8 + key_size + value_size + (uint64_t)f.block_size;
        const char *problem = value_size > 0xFFFFFFFFu ? "value of %llu bytes is too large for an entry"
                            : key_size > 0x7FFFFFFFu ? "key of %llu bytes is too large for an entry"
                            : body_size > 0xFFFFFFFFu ? "entry body of %llu bytes is too large" : NULL;
        if (problem) {
            unsigned long long size = value_size > 0xFFFFFFFFu ? value_size : key_size > 0x7FFFFFFFu ? key_size
                                                                                                     : body_size;
            PyErr_Format(PyExc_ValueError, problem, size);
            release_fields(&f);
            goto fail;
        }
        if (reserve(&out, HEADER_SIZE + (size_t)body_size) < 0) {
            release_fields(&f);
            goto fail;
        }
        long long offset = first_offset + i, stamp = f.timestamp ? f.timestamp : timestamp;
        if (raising) {
            stamp = stamp < floor ? floor : stamp;
            floor = stamp;
        }
        size_t start = out.size;
        unsigned char *entry = out.data + start, *p = entry;
        p = put_be64(p, (uint64_t)offset);
        p = put_be64(p, (uint64_t)stamp);
        p = put_be64(p, leader_epoch);
        p = put_be32(p, (uint32_t)body_size);
        p += 4; /* the CRC, once the body is in */
        p = put_be32(p, f.has_key ? (uint32_t)key_size : f.key == Py_None ? 0xFFFFFFFFu : 0);
        if (f.has_key) {
            memcpy(p, f.key_data, (size_t)key_size);
            p += key_size;
        }
        p = put_be32(p, (uint32_t)value_size);
        memcpy(p, f.value_data, (size_t)value_size);
        p += value_size;
        memcpy(p, f.block_data, (size_t)f.block_size);
        release_fields(&f);
        put_be32(entry + CRC_POSITION, entry_crc(entry, (size_t)body_size));
        out.size = start + HEADER_SIZE + (size_t)body_size;
        PyObject *item = PyTuple_New(5), *start_obj = last_end;
        if (!item)
            goto fail;
        PyList_SET_ITEM(walked, i, item);
        PyObject *stamp_obj = long_reusing(last_stamp, stamp);
        Py_XSETREF(last_stamp, stamp_obj);
        PyObject *offset_obj = PyLong_FromLongLong(offset);
        last_end = PyLong_FromSsize_t((Py_ssize_t)out.size);
        if (!stamp_obj || !offset_obj || !last_end) {
            Py_XDECREF(offset_obj);
            Py_DECREF(start_obj);
            goto fail;
        }
        PyTuple_SET_ITEM(item, 0, offset_obj);
        PyTuple_SET_ITEM(item, 1, Py_NewRef(epoch));
        PyTuple_SET_ITEM(item, 2, Py_NewRef(stamp_obj));
        PyTuple_SET_ITEM(item, 3, start_obj);
        PyTuple_SET_ITEM(item, 4, Py_NewRef(last_end));
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.size);
    PyMem_Free(out.data);
    Py_XDECREF(last_stamp);
    Py_XDECREF(last_end);
    Py_DECREF(epoch);
    if (!data) {
        Py_DECREF(walked);
        return NULL;
    }
    return Py_BuildValue("NN", data, walked);

fail:
    PyMem_Free(out.data);
    Py_XDECREF(walked);
    Py_XDECREF(epoch);
    Py_XDECREF(last_stamp);
    Py_XDECREF(last_end);
    return NULL;
}

static PyObject *new_record(PyObject *value, PyObject *headers, PyObject *block) {
    PyObject *record = record_type->tp_alloc(record_type, 0);
    if (!record)
        return NULL;
    PyObject *fields[RECORD_SLOTS] = {value, Py_None, headers, zero, block};
    for (int i = 0; i < RECORD_SLOTS; i++)
        *(PyObject **)((char *)record + record_offsets[i]) = Py_NewRef(fields[i]);
    return record;
}

/* wire.dedup.MESSAGE_ID_HEADER, as a header's name (name_message_id) and in a header block. */
static const char message_id_header[] = "Nats-Msg-Id";
#define MESSAGE_ID_HEADER_LENGTH ((Py_ssize_t)sizeof(message_id_header) - 1)

/* dedup.headers_with_id's (headers, block) as new references in *headers and *block: the shared
 * headers with the id in front, and the shared block with the id's header put before the others
 * (their count raised by one), without encoding them again. */
static int with_id(PyObject *id, PyObject *shared, PyObject *shared_block, PyObject **headers, PyObject **block) {
    if (!PyDict_Check(shared) || !PyBytes_CheckExact(shared_block) || PyBytes_GET_SIZE(shared_block) < 2) {
        PyErr_SetString(PyExc_TypeError, "the shared headers are not (headers dict, header block bytes)");
        return -1;
    }
    const unsigned char *old = (const unsigned char *)PyBytes_AS_STRING(shared_block);
    unsigned count = ((unsigned)old[0] << 8 | old[1]) + 1;
    Py_ssize_t id_size = PyBytes_GET_SIZE(id), rest = PyBytes_GET_SIZE(shared_block) - 2;
    if (count > 0xFFFF || id_size > 0xFFFFFFFF) {
        PyErr_SetString(PyExc_ValueError, "no room for a message id in the header block");
        return -1;
    }
    *block = PyBytes_FromStringAndSize(NULL, 2 + 2 + MESSAGE_ID_HEADER_LENGTH + 4 + id_size + rest);
    if (!*block)
        return -1;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(*block);
    *p++ = (unsigned char)(count >> 8);
    *p++ = (unsigned char)count;
    *p++ = 0;
    *p++ = (unsigned char)MESSAGE_ID_HEADER_LENGTH;
    memcpy(p, message_id_header, (size_t)MESSAGE_ID_HEADER_LENGTH);
    p = put_be32(p + MESSAGE_ID_HEADER_LENGTH, (uint32_t)id_size);
    memcpy(p, PyBytes_AS_STRING(id), (size_t)id_size);
    memcpy(p + id_size, old + 2, (size_t)rest);
    if (!(*headers = PyDict_New()) || PyDict_SetItem(*headers, name_message_id, id) < 0
            || PyDict_Update(*headers, shared) < 0) {
        Py_CLEAR(*headers);
        Py_CLEAR(*block);
        return -1;
    }
    return 0;
}

/* *id: a new reference to the id dedup.message_id finds in the record's headers, or NULL (none, or
 * empty); looked for only when they are not the shared ones, which carry none. */
static int record_id(PyObject *record, PyObject *shared, PyObject **id) {
    PyObject *headers;
    if (Py_TYPE(record) != record_type) {
        if (!(headers = PyObject_GetAttr(record, name_headers)))
            return -1;
    } else if (!(headers = Py_XNewRef(*(PyObject **)((char *)record + record_offsets[2])))) {
        return PyErr_Format(PyExc_AttributeError, "'Record' object has no attribute 'headers'"), -1;
    }
    PyObject *value = NULL;
    int truth = 0;
    if (headers != shared) {
        if (!PyDict_Check(headers))
            PyErr_SetString(PyExc_TypeError, "a record's headers are not a dict");
        else if ((value = PyDict_GetItemWithError(headers, name_message_id)))
            truth = PyObject_IsTrue(value);
    }
    *id = truth > 0 ? Py_NewRef(value) : NULL;
    Py_DECREF(headers);
    return truth < 0 || PyErr_Occurred() ? -1 : 0;
}

/* ids[i] = id, the list of a batch's ids made, all None, at its first id. */
static int note_id(PyObject **ids, Py_ssize_t count, Py_ssize_t i, PyObject *id) {
    if (!*ids) {
        if (!(*ids = PyList_New(count)))
            return -1;
        for (Py_ssize_t j = 0; j < count; j++)
            PyList_SET_ITEM(*ids, j, Py_NewRef(Py_None));
    }
    return PyList_SetItem(*ids, i, Py_NewRef(id));
}

/* The record of a plain payload, with its id's header when it has one (id not NULL). */
static PyObject *plain_record(PyObject *payload, PyObject *id, PyObject *shared) {
    PyObject *headers = PyTuple_GET_ITEM(shared, 0), *block = PyTuple_GET_ITEM(shared, 1);
    if (!id)
        return new_record(payload, headers, block);
    PyObject *own_headers, *own_block;
    if (with_id(id, headers, block, &own_headers, &own_block) < 0)
        return NULL;
    PyObject *record = new_record(payload, own_headers, own_block);
    Py_DECREF(own_headers);
    Py_DECREF(own_block);
    return record;
}

/* The record of an envelope, from envelope_record(payload, subject, headers, block, id or None),
 * and in *envelope_id its id (see record_id); its ack appended to acks as (i, ack). */
static PyObject *envelope_record_of(PyObject *envelope_record, PyObject *payload, PyObject *subject, PyObject *id,
                                    PyObject *shared, Py_ssize_t i, PyObject *acks, PyObject **envelope_id) {
    *envelope_id = NULL;
    PyObject *pair = PyObject_CallFunctionObjArgs(envelope_record, payload, subject, PyTuple_GET_ITEM(shared, 0),
                                                  PyTuple_GET_ITEM(shared, 1), id ? id : Py_None, NULL);
    if (!pair)
        return NULL;
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        return PyErr_SetString(PyExc_TypeError, "envelope_record did not return (record, ack)"), NULL;
    }
    PyObject *record = Py_NewRef(PyTuple_GET_ITEM(pair, 0)), *ack = PyTuple_GET_ITEM(pair, 1);
    PyObject *indexed = ack == Py_None ? NULL : Py_BuildValue("(nO)", i, ack);
    int failed = ack != Py_None && (!indexed || PyList_Append(acks, indexed) < 0);
    Py_XDECREF(indexed);
    Py_DECREF(pair);
    if (failed || record_id(record, PyTuple_GET_ITEM(shared, 0), envelope_id) < 0)
        Py_CLEAR(record);
    return record;
}

/* capture_records(deliveries, record_type, headers_of, envelope_record, magic) -> (records, acks, ids):
 * capture.capture_batch's loop. A delivery is (subject, reply, payload) or, with a message id,
 * (subject, reply, payload, id). A payload starting with magic goes to envelope_record(payload,
 * subject, headers, header_block, id or None) -> (record, ack or None); any other is a Record of
 * its own. ids: each record's id, or None when no record has one. */
static PyObject *capture_records(PyObject *self, PyObject *args) {
    PyObject *deliveries, *type, *headers_of, *envelope_record;
    Py_buffer magic;
    if (!PyArg_ParseTuple(args, "O!OOOy*", &PyList_Type, &deliveries, &type, &headers_of, &envelope_record, &magic))
        return NULL;
    PyObject *records = NULL, *acks = NULL, *ids = NULL, *shared = NULL, *subject = NULL, *reply = NULL;
    PyObject *result = NULL;
    if (learn_record_type(type) < 0 || !(acks = PyList_New(0)))
        goto done;
    Py_ssize_t count = PyList_GET_SIZE(deliveries);
    if (!(records = PyList_New(count)))
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *delivery = PyList_GET_ITEM(deliveries, i), *record, *id = NULL;
        Py_ssize_t size = PyTuple_CheckExact(delivery) ? PyTuple_GET_SIZE(delivery) : 0;
        if ((size != 3 && size != 4) || !PyBytes_CheckExact(PyTuple_GET_ITEM(delivery, 2))
                || (size == 4 && !PyBytes_CheckExact(PyTuple_GET_ITEM(delivery, 3)))) {
            PyErr_SetString(PyExc_TypeError, "a delivery is not (subject, reply, payload bytes[, id bytes])");
            goto done;
        }
        PyObject *payload = PyTuple_GET_ITEM(delivery, 2);
        if (size == 4 && PyBytes_GET_SIZE(PyTuple_GET_ITEM(delivery, 3)))
            id = Py_NewRef(PyTuple_GET_ITEM(delivery, 3)); /* an empty id is none, as dedup.message_id has it */
        /* The capture connection hands out one str per distinct subject: identity finds repeats. */
        if (PyTuple_GET_ITEM(delivery, 0) != subject || PyTuple_GET_ITEM(delivery, 1) != reply) {
            Py_XSETREF(subject, Py_NewRef(PyTuple_GET_ITEM(delivery, 0)));
            Py_XSETREF(reply, Py_NewRef(PyTuple_GET_ITEM(delivery, 1)));
            Py_XSETREF(shared, PyObject_CallFunctionObjArgs(headers_of, subject, reply, NULL));
            if (!shared || !PyTuple_CheckExact(shared) || PyTuple_GET_SIZE(shared) != 2) {
                if (shared)
                    PyErr_SetString(PyExc_TypeError, "headers_of did not return (headers, header block)");
                Py_XDECREF(id);
                goto done;
            }
        }
        if (PyBytes_GET_SIZE(payload) >= magic.len
                && memcmp(PyBytes_AS_STRING(payload), magic.buf, (size_t)magic.len) == 0) {
            PyObject *nats_id = id; /* the record's id is the envelope's own, else this one */
            record = envelope_record_of(envelope_record, payload, subject, nats_id, shared, i, acks, &id);
            Py_XDECREF(nats_id);
        } else {
            record = plain_record(payload, id, shared);
        }
        int failed = !record || (id && note_id(&ids, count, i, id) < 0);
        Py_XDECREF(id);
        if (failed) {
            Py_XDECREF(record);
            goto done;
        }
        PyList_SET_ITEM(records, i, record);
    }
    result = PyTuple_Pack(3, records, acks, ids ? ids : Py_None);

done:
    PyBuffer_Release(&magic);
    Py_XDECREF(records);
    Py_XDECREF(acks);
    Py_XDECREF(ids);
    Py_XDECREF(shared);
    Py_XDECREF(subject);
    Py_XDECREF(reply);
    return result;
}

/* publish_responses(first_offset, indices, correlation_ids, shared) -> bytes: one gRPC-framed
 * PublishResponse per acked record, as capture.publish_responses writes them: an Ack with its
 * offset (first_offset + index), its correlation id (when not empty), then the shared fields,
 * and the correlation id again in the response. */
static PyObject *publish_responses(PyObject *self, PyObject *args) {
    PyObject *indices, *correlation_ids;
    long long first_offset;
    Py_buffer shared;
    if (!PyArg_ParseTuple(args, "LO!O!y*", &first_offset, &PyList_Type, &indices, &PyList_Type, &correlation_ids,
                          &shared))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(indices);
    Output out = {NULL, 0, 0};
    if (PyList_GET_SIZE(correlation_ids) != count) {
        PyErr_SetString(PyExc_ValueError, "as many correlation ids as indices are needed");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        long long index = PyLong_AsLongLong(PyList_GET_ITEM(indices, i));
        if (index == -1 && PyErr_Occurred())
            goto fail;
        if (index < 0 || first_offset < 0 || index > INT64_MAX - first_offset) {
            PyErr_SetString(PyExc_ValueError, "an ack's offset is outside [0, 2**63)");
            goto fail;
        }
        Py_ssize_t id_size;
        const char *id = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(correlation_ids, i), &id_size);
        if (!id)
            goto fail;
        uint64_t offset = (uint64_t)(first_offset + index);
        size_t id_field = id_size ? 1 + varint_size((uint64_t)id_size) + (size_t)id_size : 0;
        size_t ack_size = 1 + varint_size(offset) + id_field + (size_t)shared.len;
        size_t response_size = 1 + varint_size(ack_size) + ack_size + id_field;
        if (response_size > 0xFFFFFFFFu) {
            PyErr_SetString(PyExc_ValueError, "a PublishResponse is too large for a gRPC message");
            goto fail;
        }
        if (reserve(&out, 5 + response_size) < 0)
            goto fail;
        unsigned char *p = out.data + out.size;
        *p++ = 0; /* not compressed */
        p = put_be32(p, (uint32_t)response_size);
        *p++ = 0x0a; /* PublishResponse.ack */
        p = put_varint(p, ack_size);
        *p++ = 0x20; /* Ack.offset */
        p = put_varint(p, offset);
        if (id_size) {
            *p++ = 0x32; /* Ack.correlationId */
            p = put_varint(p, (uint64_t)id_size);
            memcpy(p, id, (size_t)id_size);
            p += id_size;
        }
        memcpy(p, shared.buf, (size_t)shared.len);
        p += shared.len;
        if (id_size) {
            *p++ = 0x1a; /* PublishResponse.correlationId */
            p = put_varint(p, (uint64_t)id_size);
            memcpy(p, id, (size_t)id_size);
            p += id_size;
        }
        out.size = (size_t)(p - out.data);
    }
    PyBuffer_Release(&shared);
    PyObject *framed = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.size);
    PyMem_Free(out.data);
    return framed;

fail:
    PyBuffer_Release(&shared);
    PyMem_Free(out.data);
    return NULL;
}

/* ---- a PublishRequest's message id, before protobuf reads it -------------------------------- */

/* The varint at *position (at most 10 bytes, before end, below 2**64) in *value; 0 when there is none. */
static int read_varint(const unsigned char *data, size_t *position, size_t end, uint64_t *value) {
    uint64_t result = 0;
    for (unsigned shift = 0; *position < end && shift < 70; shift += 7) {
        unsigned char byte = data[(*position)++];
        if (shift == 63 && (byte & 0x7F) > 1)
            return 0; /* 2**64 or more */
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *value = result;
            return 1;
        }
    }
    return 0;
}

#define PUBLISH_HEADERS_FIELD 5
/* A map entry as protobuf writes it: key (field 1) "Nats-Msg-Id", then value (field 2)'s tag. */
static const unsigned char id_entry_head[] = "\x0a\x0bNats-Msg-Id\x12";
#define ID_ENTRY_HEAD_LENGTH (sizeof(id_entry_head) - 1)

/* Where a PublishRequest's one header, a non-empty Nats-Msg-Id, sits in its bytes: the field from
 * *start to *end, the id from *value (*length bytes); 0 when it has no such header (see
 * wire.dedup.split_message_id_python, the reference). */
static int find_message_id(const unsigned char *data, size_t size, size_t *start, size_t *end, size_t *value,
                           size_t *length) {
    size_t position = 0, entry = 0;
    int found = 0;
    while (position < size) {
        size_t field_start = position;
        uint64_t tag, number, skipped;
        if (!read_varint(data, &position, size, &tag) || tag >= ((uint64_t)1 << 32) || tag >> 3 == 0)
            return 0;
        number = tag >> 3;
        switch (tag & 7) {
        case 0:
            if (!read_varint(data, &position, size, &skipped))
                return 0;
            break;
        case 1:
        case 5:
            if (size - position < ((tag & 7) == 1 ? 8u : 4u))
                return 0;
            position += (tag & 7) == 1 ? 8 : 4;
            break;
        case 2:
            if (!read_varint(data, &position, size, &skipped) || skipped > size - position)
                return 0;
            if (number == PUBLISH_HEADERS_FIELD) {
                if (found)
                    return 0;
                found = 1;
                *start = field_start;
                entry = position;
                *end = position + (size_t)skipped;
            }
            position += (size_t)skipped;
            break;
        default: /* groups (deprecated), or no wire type at all */
            return 0;
        }
        if (number == PUBLISH_HEADERS_FIELD && (tag & 7) != 2)
            return 0;
    }
    if (!found || *end - entry < ID_ENTRY_HEAD_LENGTH || memcmp(data + entry, id_entry_head, ID_ENTRY_HEAD_LENGTH))
        return 0;
    uint64_t id_length;
    *value = entry + ID_ENTRY_HEAD_LENGTH;
    if (!read_varint(data, value, *end, &id_length) || id_length == 0 || id_length != *end - *value)
        return 0;
    *length = (size_t)id_length;
    return 1;
}

/* New references: in *rest the bytes without the id's field, in *id the id. */
static int split_at(const unsigned char *data, size_t size, size_t start, size_t end, size_t value, size_t length,
                    PyObject **rest, PyObject **id) {
    *rest = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size - (end - start)));
    if (!*rest)
        return -1;
    memcpy(PyBytes_AS_STRING(*rest), data, start);
    memcpy(PyBytes_AS_STRING(*rest) + start, data + end, size - end);
    if (!(*id = PyBytes_FromStringAndSize((const char *)data + value, (Py_ssize_t)length))) {
        Py_CLEAR(*rest);
        return -1;
    }
    return 0;
}

/* split_message_id(data) -> (data without its id's header, id) or None: wire.dedup.split_message_id. */
static PyObject *split_message_id(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg))
        return PyErr_SetString(PyExc_TypeError, "split_message_id takes bytes"), NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    size_t size = (size_t)PyBytes_GET_SIZE(arg), start, end, value, length;
    PyObject *rest, *id;
    if (!find_message_id(data, size, &start, &end, &value, &length))
        Py_RETURN_NONE;
    if (split_at(data, size, start, end, value, length, &rest, &id) < 0)
        return NULL;
    return Py_BuildValue("NN", rest, id);
}

/* decode_with_id(decode, data) -> (decode(data without its id's header), id), or (decode(data), None):
 * wire.dedup.decode_with_id_python. */
static PyObject *decode_with_id(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[1]))
        return PyErr_SetString(PyExc_TypeError, "decode_with_id takes (decode, bytes)"), NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    size_t size = (size_t)PyBytes_GET_SIZE(args[1]), start, end, value, length;
    PyObject *rest = NULL, *id = NULL, *decoded;
    if (!find_message_id(data, size, &start, &end, &value, &length)) {
        if (!(decoded = PyObject_CallOneArg(args[0], args[1])))
            return NULL;
        return Py_BuildValue("NO", decoded, Py_None);
    }
    if (split_at(data, size, start, end, value, length, &rest, &id) < 0)
        return NULL;
    decoded = PyObject_CallOneArg(args[0], rest);
    Py_DECREF(rest);
    if (!decoded) {
        Py_DECREF(id);
        return NULL;
    }
    return Py_BuildValue("NN", decoded, id);
}

/* record_with_id(record_type, value, key, id, shared, block) -> Record: wire.dedup.record_with_id_python,
 * a record whose headers are the id's and the shared ones, and its block the shared one with the
 * id's header in front (see with_id). */
static PyObject *record_with_id(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6)
        return PyErr_SetString(PyExc_TypeError, "record_with_id takes 6 arguments"), NULL;
    if (learn_record_type(args[0]) < 0)
        return NULL;
    if (!PyBytes_CheckExact(args[3]))
        return PyErr_SetString(PyExc_TypeError, "a message id is bytes"), NULL;
    PyObject *headers, *block;
    if (with_id(args[3], args[4], args[5], &headers, &block) < 0)
        return NULL;
    PyObject *record = new_record(args[1], headers, block);
    Py_DECREF(headers);
    Py_DECREF(block);
    if (record && args[2] != Py_None) {
        PyObject **key = (PyObject **)((char *)record + record_offsets[1]);
        Py_SETREF(*key, Py_NewRef(args[2]));
    }
    return record;
}

/* crc32c(data, value=0): the crc32c package's function, for the tests that hold this one to it. */
static PyObject *crc32c(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &buf, &value))
        return NULL;
    uint32_t crc = ~crc_update(~(uint32_t)value, buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(crc);
}

/* use_sse42(on) -> whether it was on: so the tests check the table path on machines with SSE 4.2. */
static PyObject *set_sse42(PyObject *self, PyObject *args) {
    int on, was = use_sse42;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
#ifdef HAVE_SSE42_PATH
    use_sse42 = on && __builtin_cpu_supports("sse4.2");
#endif
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"intact_prefix", intact_prefix, METH_VARARGS, "(length, count, stopped) of the whole, intact entries."},
    {"walked_entries", walked_entries, METH_VARARGS, "(entries as scan() yields them, stopped)."},
    {"encode_messages", encode_messages, METH_VARARGS, "(length, count, stopped, framed Messages)."},
    {"encode_entries", encode_entries, METH_VARARGS, "(entries of the records, what scan() yields of them)."},
    {"capture_records", capture_records, METH_VARARGS, "(records, acks, ids) of a burst of captured messages."},
    {"publish_responses", publish_responses, METH_VARARGS, "gRPC-framed PublishResponses acking records."},
    {"split_message_id", split_message_id, METH_O, "(request bytes without their id's header, id), or None."},
    {"decode_with_id", (PyCFunction)(void (*)(void))decode_with_id, METH_FASTCALL,
     "(a request decoded without its id's header, id), or (the request, None)."},
    {"record_with_id", (PyCFunction)(void (*)(void))record_with_id, METH_FASTCALL,
     "A Record with a message id in front of the shared headers."},
    {"crc32c", crc32c, METH_VARARGS, "CRC-32C of data, continuing from value."},
    {"use_sse42", set_sse42, METH_VARARGS, "Run the CRC on SSE 4.2's instruction (where it has it) or not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "bascule.wire._walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__walk(void) {
    uint16_t probe = 1;
    little_endian = *(unsigned char *)&probe == 1;
    crc_init_table();
    if (!(name_value = PyUnicode_InternFromString("value")) || !(name_key = PyUnicode_InternFromString("key"))
            || !(name_headers = PyUnicode_InternFromString("headers"))
            || !(name_timestamp = PyUnicode_InternFromString("timestamp"))
            || !(name_header_block = PyUnicode_InternFromString("header_block"))
            || !(name_message_id = PyUnicode_InternFromString(message_id_header))
            || !(no_headers = PyBytes_FromStringAndSize("\0\0", 2)) || !(zero = PyLong_FromLong(0)))
        return NULL;
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    use_sse42 = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
