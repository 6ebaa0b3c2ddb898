#!/usr/bin/env node
// A Node gRPC client for bascule's benchmarks (@grpc/grpc-js, the API loaded by @grpc/proto-loader):
// a Python grpc.aio client tops out near 10-20k messages/s, far below what a server can send or
// ack, so the harness measures servers with this one instead.
//
//   node grpc_bench.js subscribe <host:port> <stream> <count>
//   node grpc_bench.js publish <host:port> <stream> <count> <window> <size> <ackPolicy>
//
// Prints one JSON object on stdout; failures go to stderr with exit status 1.
//
// subscribe: Subscribe to partition 0 from EARLIEST, skip the empty handshake message, read `count`
//   messages, cancel. {"messages", "seconds" (first data message to last), "rate", "first_ms" (call
//   start to first data message)}.
// publish: one PublishAsync call, at most `window` requests unacknowledged, each with its own
//   correlationId and a value of `size` bytes. {"messages", "acked", "errors" (asyncError
//   responses), "first_error", "seconds" (first request to last response), "rate", "p50_ms",
//   "p99_ms", "max_ms"} (latencies of the acked requests, send to response).
// Both add "client_cpu_us_per_msg": this process's CPU time (user + system) per message.
//
// Environment: BASCULE_API_PROTO, the api.proto to load (default: this checkout's);
// BENCH_FLOW_WINDOW, the HTTP/2 flow-control window in bytes (default 8 MiB; 0: grpc-js's 64 KiB);
// BENCH_GO=1: connect first, then write "READY" on stderr and start once a line arrives on stdin
// (the harness measures the server's CPU from then on, without this process's start-up).
//
// Cheap on purpose: no per-message logging or allocation beyond what grpc-js and protobufjs do,
// messages decoded with the loader's defaults, timestamps into preallocated typed arrays, no
// retries. What it cannot avoid: grpc-js writes a stream's requests one at a time, each after the
// previous one reached the socket, so PublishAsync costs a writev (and the server a read) per request.
'use strict';

const path = require('path');
const { performance } = require('perf_hooks');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = process.env.BASCULE_API_PROTO
  || path.join(__dirname, '..', '..', 'src', 'bascule', 'wire', 'proto', 'api.proto');
const CONNECT_TIMEOUT_MS = 20000;
// HTTP/2 flow-control window of the connection and of each stream. grpc-js keeps the 64 KiB default
// unless told (it has no BDP probing, unlike grpc-go, whose windows grow to 16 MiB): with it, a
// server streaming small messages waits for WINDOW_UPDATEs and both sides handle many more frames.
const FLOW_WINDOW = 8 * 1024 * 1024;
const USAGE = 'usage: grpc_bench.js subscribe <host:port> <stream> <count>\n'
  + '       grpc_bench.js publish <host:port> <stream> <count> <window> <size> <ackPolicy>';

function fail(message) {
  process.stderr.write(`grpc_bench: ${message}\n`);
  process.exit(1);
}

function positiveInt(text, name) {
  const value = Number(text);
  if (!Number.isInteger(value) || value < 1) fail(`${name} must be a positive integer, not ${JSON.stringify(text)}`);
  return value;
}

function load() {
  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String });
  const api = grpc.loadPackageDefinition(definition).proto;
  const ackPolicies = {};
  for (const { name, number } of definition['proto.AckPolicy'].type.value) ackPolicies[name] = number;
  return { API: api.API, ackPolicies };
}

function connect(API, target) {
  const flowWindow = Number(process.env.BENCH_FLOW_WINDOW || FLOW_WINDOW);
  // No retries: their machinery keeps every request sent until the call commits, at a cost per message.
  const options = { 'grpc.enable_retries': 0 };
  if (flowWindow > 0) options['grpc-node.flow_control_window'] = flowWindow;
  const client = new API(target, grpc.credentials.createInsecure(), options);
  return new Promise((resolve, reject) => {
    client.waitForReady(Date.now() + CONNECT_TIMEOUT_MS, (error) => {
      if (error) reject(new Error(`could not connect to ${target}: ${error.message}`));
      else resolve(client);
    });
  });
}

// With BENCH_GO=1: READY on stderr, then wait for a line on stdin.
function readyGo() {
  if (process.env.BENCH_GO !== '1') return Promise.resolve();
  process.stderr.write('READY\n');
  return new Promise((resolve, reject) => {
    let seen = '';
    const onData = (chunk) => {
      seen += chunk;
      if (!seen.includes('\n')) return;
      process.stdin.off('data', onData);
      process.stdin.pause();
      if (seen.trim() === 'GO') resolve();
      else reject(new Error(`expected GO on stdin, got ${JSON.stringify(seen.trim())}`));
    };
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', onData);
    process.stdin.once('end', () => reject(new Error('stdin closed before GO')));
  });
}

function subscribe(client, stream, count) {
  return new Promise((resolve, reject) => {
    let received = -1; // -1 until the handshake (an empty Message) has come
    let first = 0;
    let finished = false;
    const start = performance.now();
    const call = client.Subscribe({ stream, partition: 0, startPosition: 'EARLIEST' });
    call.on('data', () => {
      if (++received <= 0) return; // the handshake
      if (received === 1) first = performance.now();
      if (received === count) {
        const end = performance.now();
        finished = true;
        call.cancel();
        const seconds = (end - first) / 1000;
        resolve({
          mode: 'subscribe',
          messages: count,
          seconds,
          rate: seconds > 0 ? count / seconds : null,
          first_ms: first - start,
        });
      }
    });
    call.on('error', (error) => {
      if (!finished) reject(new Error(`Subscribe failed after ${Math.max(received, 0)} messages: ${error.message}`));
    });
    call.on('end', () => {
      if (!finished) reject(new Error(`Subscribe ended after ${Math.max(received, 0)} of ${count} messages`));
    });
  });
}

function percentile(sorted, q) {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function publish(client, stream, count, window, size, ackPolicy) {
  return new Promise((resolve, reject) => {
    const value = Buffer.alloc(size, 'x');
    const sentAt = new Float64Array(count);
    const latencies = new Float64Array(count);
    let acked = 0;
    let errors = 0;
    let firstError = null;
    let sent = 0;
    let settled = 0;
    let finished = false;
    const call = client.PublishAsync();
    const start = performance.now();

    // At most `window` requests unacknowledged; grpc-js buffers what HTTP/2 cannot take yet.
    const pump = () => {
      while (sent < count && sent - settled < window) {
        const i = sent++;
        sentAt[i] = performance.now();
        call.write({ stream, partition: 0, value, ackPolicy, correlationId: String(i) });
      }
      if (sent === count && !finished) call.end();
    };

    call.on('data', (response) => {
      const now = performance.now();
      if (response.asyncError) {
        errors++;
        if (firstError === null) firstError = `${response.asyncError.code}: ${response.asyncError.message}`;
      } else {
        latencies[acked++] = now - sentAt[Number(response.correlationId)];
      }
      if (++settled === count) {
        finished = true;
        call.cancel();
        const seconds = (now - start) / 1000;
        const sorted = latencies.subarray(0, acked).sort();
        resolve({
          mode: 'publish',
          messages: count,
          acked,
          errors,
          first_error: firstError,
          seconds,
          rate: seconds > 0 ? count / seconds : null,
          p50_ms: percentile(sorted, 0.5),
          p99_ms: percentile(sorted, 0.99),
          max_ms: acked ? sorted[acked - 1] : null,
        });
      } else if (sent < count) {
        pump();
      }
    });
    call.on('error', (error) => {
      if (!finished) reject(new Error(`PublishAsync failed after ${settled} responses: ${error.message}`));
    });
    call.on('end', () => {
      if (!finished) reject(new Error(`PublishAsync ended after ${settled} of ${count} responses`));
    });
    pump();
  });
}

async function main(argv) {
  const [mode, target, stream] = argv;
  let run;
  if (mode === 'subscribe' && argv.length === 4) {
    const count = positiveInt(argv[3], 'count');
    run = (client) => subscribe(client, stream, count);
  } else if (mode === 'publish' && argv.length === 7) {
    const count = positiveInt(argv[3], 'count');
    const window = positiveInt(argv[4], 'window');
    const size = Number(argv[5]);
    if (!Number.isInteger(size) || size < 0) fail(`size must be an integer >= 0, not ${JSON.stringify(argv[5])}`);
    const policyName = argv[6].toUpperCase();
    run = (client, ackPolicies) => {
      const ackPolicy = ackPolicies[policyName];
      if (ackPolicy === undefined) fail(`unknown ackPolicy ${argv[6]}: one of ${Object.keys(ackPolicies).join(', ')}`);
      if (policyName === 'NONE') fail('ackPolicy NONE gets no responses: there is nothing to time');
      return publish(client, stream, count, window, size, ackPolicy);
    };
  } else {
    fail(USAGE);
  }
  const { API, ackPolicies } = load();
  const client = await connect(API, target);
  await readyGo();
  const cpu = process.cpuUsage();
  const result = await run(client, ackPolicies);
  const used = process.cpuUsage(cpu);
  result.client_cpu_us_per_msg = (used.user + used.system) / result.messages;
  process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
}

main(process.argv.slice(2)).catch((error) => fail(error.message));
