'use strict';
// Interoperability checks of bascule's gRPC API (proto.API) with Node's @grpc/grpc-js, a client
// with its own HTTP/2 stack.
//
//   node interop.js <host:port> <stream-name prefix>
//
// Runs the checks below in order against a running node (with an empty stream namespace for the
// prefix), prints one JSON line per check ({"check", "ok", "detail"}) and exits 1 if any check
// failed, 2 on a usage error.

const http2 = require('http2');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// Checks whose failure is a known difference between the current server and what a gRPC server
// must do. They still run and print their line (with "known_difference": true), but their
// failure does not fail the run. Remove a name to make its check count again.
const KNOWN_DIFFERENCES = [];

const PROTO = path.join(__dirname, '..', '..', '..', 'src', 'bascule', 'wire', 'proto', 'api.proto');
const CHECK_TIMEOUT_MS = 15000;
const ASYNC_COUNT = 200;
const BIG_VALUE_BYTES = 1024 * 1024;
const GZIP = 2; // grpc-js's compression algorithm number for gzip

const [address, prefix] = process.argv.slice(2);
if (!address || !prefix) {
  console.error('usage: node interop.js <host:port> <stream-name prefix>');
  process.exit(2);
}

const definition = protoLoader.loadSync(PROTO, {keepCase: true, longs: String, enums: String, defaults: true});
const API = grpc.loadPackageDefinition(definition).proto.API;
const client = new API(address, grpc.credentials.createInsecure());
const gzipClient = new API(address, grpc.credentials.createInsecure(), {'grpc.default_compression_algorithm': GZIP});

// --- a tap on grpc-js's HTTP/2 streams ------------------------------------------------------------
// grpc-js hides the wire (it strips grpc-encoding from the metadata it hands up), so to show that
// the gzip check really sends and receives compressed messages, every HTTP/2 stream grpc-js opens
// is watched: its request and response grpc-encoding, and the compressed flag of each gRPC message
// either way. Nothing is changed, only observed.

/** Counts the gRPC messages (5-byte prefix: compressed flag, uint32 length) in a byte stream. */
class MessageCounter {
  constructor() {
    this.compressed = 0;
    this.plain = 0;
    this.header = [];
    this.remaining = 0;
  }

  add(chunk) {
    let i = 0;
    while (i < chunk.length) {
      if (this.remaining > 0) {
        const take = Math.min(this.remaining, chunk.length - i);
        this.remaining -= take;
        i += take;
        continue;
      }
      this.header.push(chunk[i++]);
      if (this.header.length === 5) {
        const [flag, ...length] = this.header;
        if (flag) this.compressed++; else this.plain++;
        this.remaining = Buffer.from(length).readUInt32BE(0);
        this.header = [];
      }
    }
  }
}

const wire = []; // one entry per HTTP/2 stream grpc-js opened

function tapStream(headers, h2stream) {
  const entry = {
    path: headers[':path'], requestEncoding: headers['grpc-encoding'] ?? 'identity', responseEncoding: null,
    sent: new MessageCounter(), received: new MessageCounter(),
  };
  wire.push(entry);
  const write = h2stream.write;
  h2stream.write = function (chunk, ...rest) {
    if (Buffer.isBuffer(chunk)) entry.sent.add(chunk);
    return write.call(this, chunk, ...rest);
  };
  h2stream.on('response', (response) => {
    entry.responseEncoding = response['grpc-encoding'] ?? 'identity';
  });
  h2stream.on('data', (chunk) => entry.received.add(chunk));
}

const connect = http2.connect;
http2.connect = function (...args) {
  const session = connect.apply(this, args);
  const request = session.request;
  session.request = function (headers, ...rest) {
    const h2stream = request.call(this, headers, ...rest);
    tapStream(headers, h2stream);
    return h2stream;
  };
  return session;
};

function wireSummary(entry) {
  const count = (c) => ({compressed: c.compressed, plain: c.plain});
  return {path: entry.path, requestEncoding: entry.requestEncoding, responseEncoding: entry.responseEncoding,
    sent: count(entry.sent), received: count(entry.received)};
}

// --------------------------------------------------------------------------------------------------

const stream = `${prefix}-stream`;
const subject = `${prefix}.subject`;
const valueAt = (offset) => `m${offset}`;
const codeName = (code) => grpc.status[code] ?? String(code);

class CheckFailed extends Error {
  constructor(message, detail) {
    super(message);
    this.detail = detail;
  }
}

function expect(condition, message, detail) {
  if (!condition) throw new CheckFailed(message, detail);
}

function deadline(ms) {
  return new Date(Date.now() + ms);
}

/** A unary call as {error, response}: the error a grpc-js ServiceError (code, details). */
function unary(target, method, request, options = {}) {
  return new Promise((resolve) => {
    target[method](request, new grpc.Metadata(), options, (error, response) => resolve({error, response}));
  });
}

/** A unary call that must succeed: its response. */
async function ok(target, method, request, options) {
  const {error, response} = await unary(target, method, request, options);
  expect(!error, `${method} failed`, error && statusOf(error));
  return response;
}

/** A unary call that must fail with ``code``. */
async function fails(target, method, request, code, options) {
  const {error, response} = await unary(target, method, request, options);
  expect(error, `${method} succeeded, ${codeName(code)} expected`, response);
  expect(error.code === code, `${method} gave ${codeName(error.code)}, ${codeName(code)} expected`, statusOf(error));
  return statusOf(error);
}

function statusOf(status) {
  return {code: codeName(status.code), details: status.details};
}

/**
 * Reads a server stream: every message, then its final status. ``onMessage(message, messages)`` may
 * cancel the call. Resolves with {messages, status, error, elapsedMs}.
 */
function readStream(call, onMessage = () => {}) {
  const started = Date.now();
  const messages = [];
  let error = null;
  return new Promise((resolve) => {
    call.on('data', (message) => {
      messages.push(message);
      onMessage(message, messages);
    });
    call.on('error', (e) => {
      error = e;
    });
    call.on('status', (status) => {
      // 'status' comes after 'error'; let a pending 'error' (same tick) land first.
      setImmediate(() => resolve({messages, status, error, elapsedMs: Date.now() - started}));
    });
  });
}

function subscribe(target, request, options = {}) {
  return readStream(target.Subscribe(request, new grpc.Metadata(), options), () => {});
}

function isHandshake(message) {
  return message.offset === '0' && message.value.length === 0 && message.stream === '' && message.key.length === 0;
}

function offsetsOf(messages) {
  return messages.map((m) => Number(m.offset));
}

function range(first, last) {
  return Array.from({length: last - first + 1}, (_, i) => first + i);
}

function sameList(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailed(`${what} did not finish within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// --- the checks -------------------------------------------------------------------------------

async function createStream() {
  const request = {subject, name: stream, partitions: 1};
  await ok(client, 'CreateStream', request, {deadline: deadline(10000)});
  const again = await fails(client, 'CreateStream', request, grpc.status.ALREADY_EXISTS, {deadline: deadline(10000)});
  return {stream, subject, again};
}

async function fetchMetadata() {
  const response = await ok(client, 'FetchMetadata', {streams: []}, {deadline: deadline(5000)});
  const entry = response.streamMetadata.find((s) => s.name === stream);
  expect(entry, 'stream not listed', response.streamMetadata.map((s) => s.name));
  expect(entry.error === 'OK' && entry.subject === subject, 'wrong stream metadata', entry);
  expect(Object.keys(entry.partitions).length === 1, 'not one partition', entry.partitions);
  expect(response.brokers.length >= 1, 'no brokers', response.brokers);
  return {brokers: response.brokers.map((b) => `${b.id}@${b.host}:${b.port}`), partitions: Object.keys(entry.partitions)};
}

async function publish() {
  const request = {stream, value: Buffer.from(valueAt(0)), ackPolicy: 'ALL', correlationId: 'c0'};
  const response = await ok(client, 'Publish', request, {deadline: deadline(10000)});
  expect(response.ack, 'no ack', response);
  expect(response.ack.stream === stream && response.ack.offset === '0', 'wrong ack', response.ack);
  expect(response.correlationId === 'c0', 'wrong correlationId', response);
  return {offset: response.ack.offset, ackPolicy: response.ack.ackPolicy};
}

async function publishAsync() {
  const call = client.PublishAsync(new grpc.Metadata(), {deadline: deadline(CHECK_TIMEOUT_MS)});
  const read = readStream(call);
  for (let offset = 1; offset <= ASYNC_COUNT; offset++) {
    call.write({stream, value: Buffer.from(valueAt(offset)), ackPolicy: 'LEADER', correlationId: `c${offset}`});
  }
  call.end();
  const {messages, status} = await read;
  expect(status.code === grpc.status.OK, `call ended with ${codeName(status.code)}`, statusOf(status));
  expect(messages.length === ASYNC_COUNT, `${messages.length} responses, ${ASYNC_COUNT} expected`,
    messages.slice(0, 3));
  const errors = messages.filter((m) => m.asyncError || !m.ack);
  expect(!errors.length, 'responses without an ack', errors.slice(0, 3));
  const ids = messages.map((m) => m.ack.correlationId);
  const expectedIds = range(1, ASYNC_COUNT).map((i) => `c${i}`);
  expect(sameList(ids, expectedIds), 'acks do not carry the correlation ids in order', ids.slice(0, 10));
  expect(sameList(messages.map((m) => m.correlationId), expectedIds), 'responses do not carry the correlation ids',
    messages.slice(0, 2));
  const offsets = messages.map((m) => Number(m.ack.offset));
  expect(sameList(offsets, range(1, ASYNC_COUNT)), 'offsets are not 1..200 in order', offsets.slice(0, 10));
  expect(messages.every((m) => m.ack.stream === stream), 'acks name another stream', messages[0].ack);
  return {responses: messages.length, first: offsets[0], last: offsets[offsets.length - 1]};
}

async function subscribeEarliestThenCancel() {
  const want = ASYNC_COUNT + 2; // the handshake and offsets 0..200
  const call = client.Subscribe({stream, partition: 0, startPosition: 'EARLIEST'});
  const {messages, status, error} = await readStream(call, (_, all) => {
    if (all.length === want) call.cancel();
  });
  expect(messages.length === want, `${messages.length} messages before the end, ${want} expected`,
    {status: statusOf(status), last: messages.slice(-1)});
  expect(isHandshake(messages[0]), 'first message is not an empty handshake', messages[0]);
  const data = messages.slice(1);
  expect(sameList(offsetsOf(data), range(0, ASYNC_COUNT)), 'offsets are not 0..200', offsetsOf(data).slice(0, 10));
  const wrong = data.filter((m) => m.value.toString() !== valueAt(Number(m.offset)) || m.stream !== stream);
  expect(!wrong.length, 'wrong values or stream', wrong.slice(0, 3).map((m) => ({offset: m.offset, stream: m.stream,
    value: m.value.toString()})));
  expect(status.code === grpc.status.CANCELLED, `ended with ${codeName(status.code)}, CANCELLED expected`,
    statusOf(status));
  expect(error && error.code === grpc.status.CANCELLED, 'no CANCELLED error event', error && statusOf(error));
  return {messages: data.length, status: statusOf(status)};
}

async function subscribeStopOffset() {
  const {messages, status} = await subscribe(client, {
    stream, partition: 0, startPosition: 'EARLIEST', stopPosition: 'STOP_OFFSET', stopOffset: '5',
  }, {deadline: deadline(10000)});
  expect(messages.length >= 1 && isHandshake(messages[0]), 'no handshake first',
    {first: messages[0], status: statusOf(status)});
  const offsets = offsetsOf(messages.slice(1));
  expect(sameList(offsets, range(0, 5)), 'offsets are not 0..5', offsets);
  expect(status.code === grpc.status.RESOURCE_EXHAUSTED, `ended with ${codeName(status.code)}, RESOURCE_EXHAUSTED expected`,
    statusOf(status));
  return {offsets, status: statusOf(status)};
}

/** liftbridge-api v2's reverse flag (field 12 in bascule's proto): newest to oldest, then Liftbridge's "EOF". */
async function subscribeReverse() {
  const {messages, status} = await subscribe(client, {
    stream, partition: 0, startPosition: 'OFFSET', startOffset: '5', reverse: true,
  }, {deadline: deadline(10000)});
  expect(messages.length >= 1 && isHandshake(messages[0]), 'no handshake first',
    {first: messages[0], status: statusOf(status)});
  const offsets = offsetsOf(messages.slice(1));
  expect(sameList(offsets, range(0, 5).reverse()), 'offsets are not 5..0', offsets);
  expect(status.code === grpc.status.UNKNOWN && status.details === 'EOF',
    `ended with ${codeName(status.code)} ${status.details}, UNKNOWN EOF expected`, statusOf(status));
  return {offsets, status: statusOf(status)};
}

async function subscribeMissingStream() {
  const {messages, status} = await subscribe(client, {stream: `${prefix}-missing`, partition: 0,
    startPosition: 'EARLIEST'}, {deadline: deadline(10000)});
  expect(status.code === grpc.status.NOT_FOUND, `ended with ${codeName(status.code)}, NOT_FOUND expected`,
    {status: statusOf(status), messages: messages.length});
  return {status: statusOf(status), messages: messages.length};
}

async function subscribeDeadline() {
  const {messages, status, elapsedMs} = await subscribe(client, {stream, partition: 0, startPosition: 'LATEST'},
    {deadline: deadline(200)});
  expect(status.code === grpc.status.DEADLINE_EXCEEDED, `ended with ${codeName(status.code)}, DEADLINE_EXCEEDED expected`,
    {status: statusOf(status), elapsedMs});
  expect(elapsedMs < 2000, `took ${elapsedMs} ms`, statusOf(status));
  // LATEST starts at the newest message: the handshake, then offset 200 at most.
  expect(messages.length <= 2, `${messages.length} messages`, offsetsOf(messages));
  return {status: statusOf(status), elapsedMs, messages: messages.length};
}

async function unknownMethod() {
  const {error, response} = await new Promise((resolve) => {
    client.makeUnaryRequest('/proto.API/NoSuchMethod', (b) => b, (b) => b, Buffer.alloc(0),
      new grpc.Metadata(), {deadline: deadline(5000)}, (e, r) => resolve({error: e, response: r}));
  });
  expect(error, 'call succeeded', response);
  expect(error.code === grpc.status.UNIMPLEMENTED, `gave ${codeName(error.code)}, UNIMPLEMENTED expected`,
    statusOf(error));
  return statusOf(error);
}

async function cursors() {
  await ok(client, 'SetCursor', {stream, partition: 0, cursorId: 'c1', offset: '7'}, {deadline: deadline(10000)});
  const response = await ok(client, 'FetchCursor', {stream, partition: 0, cursorId: 'c1'}, {deadline: deadline(5000)});
  expect(response.offset === '7', `FetchCursor gave ${response.offset}, 7 expected`, response);
  return {offset: response.offset};
}

/** Publishes ``value`` through ``target``; returns the ack's offset after reading it back. */
async function publishAndReadBack(target, value, correlationId) {
  const response = await ok(target, 'Publish', {stream, value, ackPolicy: 'LEADER', correlationId},
    {deadline: deadline(10000)});
  expect(response.ack && response.ack.correlationId === correlationId, 'no ack', response);
  const offset = response.ack.offset;
  const call = target.Subscribe({stream, partition: 0, startPosition: 'OFFSET', startOffset: offset},
    {deadline: deadline(10000)});
  const {messages, status} = await readStream(call, (_, all) => {
    if (all.length === 2) call.cancel();
  });
  expect(messages.length === 2, `${messages.length} messages`, statusOf(status));
  expect(isHandshake(messages[0]), 'no handshake first', messages[0]);
  const got = messages[1];
  expect(got.offset === offset, `read offset ${got.offset}, ${offset} expected`);
  expect(Buffer.compare(got.value, value) === 0, 'value differs', {sent: value.length, got: got.value.length});
  return {offset, bytes: got.value.length};
}

async function bigValue() {
  const value = Buffer.alloc(BIG_VALUE_BYTES);
  for (let i = 0; i < value.length; i++) value[i] = (i * 7919 + (i >> 9)) & 0xff; // not compressible, not uniform
  return publishAndReadBack(client, value, 'big');
}

async function gzip() {
  const value = Buffer.from('gzip me '.repeat(8192)); // 64 KiB, compresses well
  const firstStream = wire.length;
  const result = await publishAndReadBack(gzipClient, value, 'gzip');
  await ok(gzipClient, 'FetchMetadata', {streams: [stream]}, {deadline: deadline(5000)});
  // The calls really travelled gzipped: grpc-js sent gzip, and the server answered in gzip.
  const calls = wire.slice(firstStream).map(wireSummary);
  for (const method of ['Publish', 'Subscribe', 'FetchMetadata']) {
    const call = calls.find((c) => c.path === `/proto.API/${method}`);
    expect(call, `no ${method} call seen on the wire`, calls);
    expect(call.requestEncoding === 'gzip' && call.sent.compressed >= 1 && call.sent.plain === 0,
      `${method} was not sent gzipped`, call);
    expect(call.responseEncoding === 'gzip' && call.received.compressed >= 1,
      `${method}'s response was not gzipped`, call);
  }
  return {...result, wire: calls};
}

async function subscribeStopBeforeStart() {
  const {status} = await subscribe(client, {
    stream, partition: 0, startPosition: 'OFFSET', startOffset: '2', stopPosition: 'STOP_OFFSET', stopOffset: '1',
  }, {deadline: deadline(5000)});
  expect(status.code === grpc.status.INVALID_ARGUMENT, `ended with ${codeName(status.code)}, INVALID_ARGUMENT expected`,
    statusOf(status));
  expect(status.details === 'Stop offset is before start offset: 1 < 2', 'not Liftbridge\'s words', statusOf(status));
  return statusOf(status);
}

async function partitionEventTimestamps() {
  const response = await ok(client, 'FetchPartitionMetadata', {stream, partition: 0}, {deadline: deadline(5000)});
  const received = response.metadata.messagesReceivedTimestamps;
  expect(received && Number(received.firstTimestamp) > 0 && Number(received.latestTimestamp) >= Number(received.firstTimestamp),
    'no messages-received timestamps', response.metadata);
  return {messagesReceived: received};
}

/** A consumer group as go-liftbridge drives one: join, fetch the assignments, read as a member, leave. */
async function consumerGroup() {
  const group = `${stream}-group`;
  const joined = await ok(client, 'JoinConsumerGroup', {groupId: group, consumerId: 'c1', streams: [stream]},
    {deadline: deadline(10000)});
  expect(joined.coordinator && Number(joined.epoch) > 0 && Number(joined.consumerTimeout) > 0, 'bad join', joined);
  const coordinator = joined.coordinator;
  const fetched = await ok(client, 'FetchConsumerGroupAssignments', {groupId: group, consumerId: 'c1', epoch: joined.epoch},
    {deadline: deadline(5000)});
  expect(fetched.assignments.length === 1 && fetched.assignments[0].stream === stream
    && sameList(fetched.assignments[0].partitions, [0]), 'not assigned partition 0', fetched);
  const consumer = {groupId: group, groupEpoch: fetched.epoch, consumerId: 'c1'};
  const {messages, status} = await subscribe(client, {
    stream, partition: 0, startPosition: 'EARLIEST', stopPosition: 'STOP_OFFSET', stopOffset: '0', consumer,
  }, {deadline: deadline(10000)});
  expect(sameList(offsetsOf(messages.slice(1)), [0]) && status.code === grpc.status.RESOURCE_EXHAUSTED,
    'the member did not read offset 0', {offsets: offsetsOf(messages), status: statusOf(status)});
  const stale = await subscribe(client, {stream, partition: 0, startPosition: 'EARLIEST', consumer: {...consumer, consumerId: 'c2'}},
    {deadline: deadline(5000)});
  expect(stale.status.code === grpc.status.FAILED_PRECONDITION, 'a non-member read the partition', statusOf(stale.status));
  const metadata = await ok(client, 'FetchMetadata', {streams: [stream], groups: [group]}, {deadline: deadline(5000)});
  const listed = metadata.groupMetadata.find((g) => g.groupId === group);
  expect(listed && listed.coordinator === coordinator && listed.epoch === fetched.epoch, 'group not in metadata',
    metadata.groupMetadata);
  await ok(client, 'LeaveConsumerGroup', {groupId: group, consumerId: 'c1'}, {deadline: deadline(10000)});
  const gone = await fails(client, 'FetchConsumerGroupAssignments', {groupId: group, consumerId: 'c1', epoch: fetched.epoch},
    grpc.status.NOT_FOUND, {deadline: deadline(5000)});
  return {coordinator, epoch: fetched.epoch, afterLeave: gone};
}

async function deleteStream() {
  await ok(client, 'DeleteStream', {name: stream}, {deadline: deadline(10000)});
  const again = await fails(client, 'DeleteStream', {name: stream}, grpc.status.NOT_FOUND, {deadline: deadline(10000)});
  return {again};
}

const CHECKS = [
  ['create_stream', createStream],
  ['fetch_metadata', fetchMetadata],
  ['publish', publish],
  ['publish_async', publishAsync],
  ['subscribe_earliest_then_cancel', subscribeEarliestThenCancel],
  ['subscribe_stop_offset', subscribeStopOffset],
  ['subscribe_reverse', subscribeReverse],
  ['subscribe_missing_stream', subscribeMissingStream],
  ['subscribe_deadline', subscribeDeadline],
  ['unknown_method', unknownMethod],
  ['cursors', cursors],
  ['subscribe_stop_before_start', subscribeStopBeforeStart],
  ['partition_event_timestamps', partitionEventTimestamps],
  ['consumer_group', consumerGroup],
  ['big_value', bigValue],
  ['gzip', gzip],
  ['delete_stream', deleteStream],
];

async function main() {
  const unknown = KNOWN_DIFFERENCES.filter((name) => !CHECKS.some(([check]) => check === name));
  if (unknown.length) {
    console.error(`KNOWN_DIFFERENCES names no check: ${unknown.join(', ')}`);
    process.exit(2);
  }
  let failed = 0;
  for (const [name, check] of CHECKS) {
    const known = KNOWN_DIFFERENCES.includes(name);
    let line;
    try {
      const detail = await withTimeout(check(), CHECK_TIMEOUT_MS, name);
      line = {check: name, ok: true, detail};
    } catch (e) {
      const detail = e instanceof CheckFailed ? {error: e.message, detail: e.detail} : {error: String(e && e.stack || e)};
      line = {check: name, ok: false, detail};
      if (!known) failed++;
    }
    if (known) line.known_difference = true;
    console.log(JSON.stringify(line));
  }
  client.close();
  gzipClient.close();
  // Exit now: a check that timed out may have left a call open. (stdout to a pipe or file is
  // written synchronously, so every line is out.)
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(e && e.stack || e);
  process.exit(1);
});
