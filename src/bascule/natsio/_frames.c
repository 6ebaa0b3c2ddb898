/* The capture connection's frame loop (bascule.natsio.capture.parse_frames) in C: in Python it
 * was a third of a captured message's cost in the node. Same contract, same deliveries, message
 * ids from HMSG header blocks included (tests hold it to the Python loop on arbitrary bytes).
 *
 * Only frames whose MSG/HMSG line is already in the cache of parsed lines are taken here; any
 * other line (a new MSG line, INFO, PING, -ERR, garbage) goes back to Python, which parses it
 * (and caches it) by the protocol's rules kept in one place, then calls again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* What the loop needs of one cached Frame (sid, subject, reply, header bytes, total bytes). */
typedef struct {
    const char *line;
    Py_ssize_t line_length;
    PyObject *frame, *subject, *reply, *batch; /* held until the next look-up */
    Py_ssize_t header_size, total;
} Known;

static Py_ssize_t find_crlf(const char *data, Py_ssize_t from, Py_ssize_t end) {
    while (from + 1 < end) {
        const char *cr = memchr(data + from, '\r', (size_t)(end - 1 - from));
        if (!cr)
            return -1;
        Py_ssize_t at = cr - data;
        if (data[at + 1] == '\n')
            return at;
        from = at + 1;
    }
    return -1;
}

static void forget(Known *known) {
    Py_CLEAR(known->frame);
    Py_CLEAR(known->batch);
    known->line_length = -1;
}

/* Fills `known` from the cached frame of the line; 0 if the line is not cached, -1 on error. */
static int look_up(PyObject *frames, PyObject *batches, const char *line, Py_ssize_t length, Known *known) {
    forget(known);
    PyObject *key = PyBytes_FromStringAndSize(line, length);
    if (!key)
        return -1;
    PyObject *frame = PyDict_GetItemWithError(frames, key);
    Py_DECREF(key);
    if (!frame)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(frame) || PyTuple_GET_SIZE(frame) != 5) {
        PyErr_SetString(PyExc_TypeError, "a cached frame is not a 5-tuple");
        return -1;
    }
    known->frame = Py_NewRef(frame);
    PyObject *sid = PyTuple_GET_ITEM(frame, 0);
    known->subject = PyTuple_GET_ITEM(frame, 1);
    known->reply = PyTuple_GET_ITEM(frame, 2);
    known->header_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(frame, 3));
    known->total = PyLong_AsSsize_t(PyTuple_GET_ITEM(frame, 4));
    if ((known->header_size == -1 || known->total == -1) && PyErr_Occurred())
        return -1;
    if (known->header_size < 0 || known->total < known->header_size || known->total > PY_SSIZE_T_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "a cached frame has impossible sizes");
        return -1;
    }
    PyObject *batch = PyDict_GetItemWithError(batches, sid);
    if (batch) {
        Py_INCREF(batch);
    } else {
        if (PyErr_Occurred() || !(batch = PyList_New(0)))
            return -1;
        known->batch = batch;
        if (PyDict_SetItem(batches, sid, batch) < 0)
            return -1;
    }
    known->batch = batch;
    known->line = line;
    known->line_length = length;
    return 1;
}

/* The id a NATS header block carries, as capture.header_message_id finds it: after the NATS/1.0
 * status, the first line starting with the exact name and a colon, up to its CRLF, without the
 * spaces and tabs around it. Its length (0: none, an empty one, or no such block), *id its start. */
static const char status[] = "NATS/1.0", id_name[] = "Nats-Msg-Id:"; /* wire.dedup.MESSAGE_ID_HEADER */
#define STATUS_LENGTH ((Py_ssize_t)sizeof(status) - 1)
#define ID_NAME_LENGTH ((Py_ssize_t)sizeof(id_name) - 1)

static Py_ssize_t header_id(const char *block, Py_ssize_t size, const char **id) {
    /* The shortest id line is CRLF, the name, one byte, CRLF: a CRLF closer to the end starts none
     * (nor are the lines looked into after it). */
    const Py_ssize_t shortest_line = 2 + ID_NAME_LENGTH + 3, last = size - shortest_line + 2;
    if (size < STATUS_LENGTH + shortest_line || memcmp(block, status, (size_t)STATUS_LENGTH) != 0)
        return 0;
    Py_ssize_t crlf = find_crlf(block, STATUS_LENGTH, last);
    while (crlf >= 0 && memcmp(block + crlf + 2, id_name, (size_t)ID_NAME_LENGTH) != 0)
        crlf = find_crlf(block, crlf + 2, last);
    if (crlf < 0)
        return 0;
    Py_ssize_t start = crlf + 2 + ID_NAME_LENGTH, end = find_crlf(block, start, size);
    if (end < 0)
        return 0;
    while (start < end && (block[start] == ' ' || block[start] == '\t'))
        start++;
    while (end > start && (block[end - 1] == ' ' || block[end - 1] == '\t'))
        end--;
    *id = block + start;
    return end - start;
}

/* (subject, reply, payload) of the message whose header block starts at `message`, with its id
 * fourth when the block carries one (MSG frames have no block: only HMSG ones are looked into). */
static PyObject *new_delivery(const Known *known, const char *message) {
    PyObject *payload = PyBytes_FromStringAndSize(message + known->header_size, known->total - known->header_size);
    if (!payload)
        return NULL;
    const char *id;
    Py_ssize_t id_length = header_id(message, known->header_size, &id);
    PyObject *message_id = id_length ? PyBytes_FromStringAndSize(id, id_length) : NULL, *delivery = NULL;
    if (!id_length)
        delivery = PyTuple_Pack(3, known->subject, known->reply, payload);
    else if (message_id)
        delivery = PyTuple_Pack(4, known->subject, known->reply, payload, message_id);
    Py_DECREF(payload);
    Py_XDECREF(message_id);
    return delivery;
}

/* parse_frames(buffer, position, frames, batches) -> (position, needed, line_end) */
static PyObject *parse_frames(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t position;
    PyObject *frames, *batches;
    if (!PyArg_ParseTuple(args, "y*nO!O!", &view, &position, &PyDict_Type, &frames, &PyDict_Type, &batches))
        return NULL;
    const char *data = view.buf;
    Py_ssize_t end = view.len, needed = 0, line_end = -1;
    Known known = {NULL, -1, NULL, NULL, NULL, NULL, 0, 0};
    PyObject *result = NULL;
    if (position < 0 || position > end) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "position %zd outside a buffer of %zd bytes", position, end);
    }
    while (position < end) {
        Py_ssize_t crlf = find_crlf(data, position, end);
        if (crlf < 0)
            break;
        Py_ssize_t length = crlf - position;
        /* A stream's messages repeat a line (same subject, same size): compare before hashing. */
        if (!(length == known.line_length && memcmp(data + position, known.line, (size_t)length) == 0)) {
            int found = look_up(frames, batches, data + position, length, &known);
            if (found < 0)
                goto fail;
            if (!found) {
                line_end = crlf;
                break;
            }
        }
        Py_ssize_t payload_start = crlf + 2, payload_end = payload_start + known.total;
        if (payload_end + 2 > end) {
            needed = payload_end + 2 - position;
            break;
        }
        if (data[payload_end] != '\r' || data[payload_end + 1] != '\n') {
            line_end = -2;
            break;
        }
        PyObject *delivery = new_delivery(&known, data + payload_start);
        if (!delivery)
            goto fail;
        int failed = PyList_Append(known.batch, delivery);
        Py_DECREF(delivery);
        if (failed < 0)
            goto fail;
        position = payload_end + 2;
    }
    result = Py_BuildValue("nnn", position, needed, line_end);
fail:
    forget(&known);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"parse_frames", parse_frames, METH_VARARGS, "(position, needed, line_end): the cached frames from position."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "bascule.natsio._frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
