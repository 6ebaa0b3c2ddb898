"""bascule against JetStream on loopback, one command (GitHub issue 5): ``python benchmarks/run.py``.

Every scenario starts its own servers (real processes, temporary directories), runs its trials against
bascule and then against JetStream, and stops everything again, whatever happened. Load comes from
worker processes (``python -m benchmarks.worker_process KIND SPEC``) so that the measuring process is
not the bottleneck; workers connect, say READY, wait for GO on stdin, run, and print one RESULT line.

    python benchmarks/run.py                    # every scenario, 3 trials, full message counts
    python benchmarks/run.py --quick            # a short smoke run (1 trial, small counts)
    python benchmarks/run.py --scenario capture_r3 --scenario acked_r3 --trials 5 --json results.json
    python benchmarks/run.py --profile prof/    # plus one extra, unmeasured, py-spy-profiled trial

Scenarios (100-byte messages unless noted):

- capture_r1 / capture_r3: plain NATS publishes into a stream; rate = messages committed / time
  (bascule: HW reached the last offset; JetStream: stream state.messages reached the count).
- acked_r3: pipelined publishes with ack ALL, window 1000: bascule through gRPC PublishAsync and through
  Liftbridge envelopes with an ack inbox over NATS; JetStream through js.publish_async. Rate, p50/p99.
- consume_r3: read a prefilled R3 stream from the start (bascule client subscribe; JetStream ordered
  consumer).
- durable_r1: capture and acked rates with fsync before ack (bascule streams.sync=always; JetStream
  sync_interval: always).
- ceiling: one Python process receiving plain NATS messages from another, no stream at all.
- failover: SIGKILL of a partition (stream) leader in a 3-node cluster; time until an ack-ALL publish
  succeeds again.
- scale: bascule capture rate with 1, 10 and 100 partitions.
- restart: RSS of a node with 100 idle partitions and around 1M captured messages and a full read; time
  from process start to serving a subscribe of the last of those messages (SIGTERM and SIGKILL).

The gRPC figures of acked_r3 and consume_r3 come twice: ``grpc_*`` from a Python grpc.aio client
(itself the bottleneck, at 10-20k messages/s) and ``node_grpc_*`` from a Node @grpc/grpc-js client
(``benchmarks/node/grpc_bench.js``; ``npm ci`` runs once per run when its node_modules is missing,
and the metrics are skipped, with the reason printed, without node or npm). ``benchmarks/grpc_stacks.py``
measures the floor of each Python gRPC server stack (grpcio, bascule.h2grpc, grpclib) with that client.

The modules: ``run`` (the command), ``scenarios`` (the table of scenarios) with their bodies in
``throughput``, ``failover`` and ``restart``; ``trials`` and ``measure`` (a trial and its measured phase);
``systems`` (bascule and JetStream started and driven); ``workers`` (the harness's side of the worker
processes) and ``worker_process`` (theirs); ``node_client`` (the Node client's setup and runs);
``metrics``, ``environment``, ``profiling``, ``report``.
"""
