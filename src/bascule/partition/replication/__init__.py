"""Partition replication rules as pure, sans-I/O state machines.

Nothing here touches NATS, the disk or a clock: the shells (``bascule.partition``) feed values
and events in (time as a float ``now``) and carry the returned decisions/actions out.

Offset conventions (Liftbridge's), used everywhere in this package:

- **HW** (high watermark) = offset of the *last committed* message; ``-1`` = nothing committed.
- **log end offset** (LEO) = offset the *next* message will get (last offset + 1). A follower's
  fetch names its LEO; on Liftbridge's wire the ReplicationRequest ``offset`` is its newest
  offset, i.e. LEO - 1 (-1 when empty): the shell converts.
- So HW = min(LEO over the ISR) - 1, and an ALL-ack for offset X may fire once HW >= X.
- Epoch queries follow Kafka (KIP-101/279): the answer to "end of epoch E" is (largest epoch
  <= E the leader knows, *exclusive* end offset of it); ``EpochHistory.end_offset_for`` computes
  it on the leader. (-1, -1) = no such epoch. ``LeaderEpochOffsetResponse.leaderEpoch`` is
  unsigned on the wire: the shell passes ``end_offset=-1`` for "unknown", whatever the epoch.

Modules and their API
---------------------

``hw``
    - ``leader_high_watermark(current_hw, isr_log_ends, min_isr) -> int``: min LEO - 1 over the
      ISR (leader included; ``None`` = unknown blocks), only while |ISR| >= min_isr, monotonic.
    - ``follower_high_watermark(current_hw, leader_hw, log_end_offset) -> int``:
      max(current, min(leader HW, own last offset)).
    - ``clamp_high_watermark(hw, log_end_offset) -> int``: after a truncation.

``isr`` (leader side, inside ``Leadership``)
    - ``IsrTracker(leader_id, leader_epoch, replicas, isr, *, leader_log_end, hw, min_isr,
      max_lag_time, leader_timeout, now, epoch_start=None)``; attributes ``hw``, ``isr``, ``can_commit``. The HW
      may already move at construction (a leader that is the whole ISR): read ``hw`` then.
    - ``.leader_appended(log_end_offset) -> list[str]``: followers to notify (waiting ones).
      Under sync policy "always", pass the *durable* log end.
    - ``.record_fetch(replica_id, log_end_offset, leader_epoch, now, leader_time=0.0) -> bool``:
      False = answer with no data (unknown replica, other epoch, beyond this leader's log);
      ``leader_time`` is the echo of this leader's clock that renews its lease.
    - ``.lease_expiry()``, ``.holds_lease(now)``; ``.shrink_proposed(replica_id, partition_epoch)``,
      ``.shrink_refused(replica_id)``: a removal in flight counts for the lease.
    - ``.is_caught_up(replica_id)``, ``.last_caught_up(replica_id)``, ``.progress(replica_id)``.
    - ``.shrink_proposals(now) -> list[str]``: lagging > max_lag_time, or lacking committed
      messages (log end <= HW); repeated until committed (the shell rate-limits).
    - ``.expand_proposals(now, partition_epoch) -> list[str]``: each replica once; it is then
      *pending* and counts for the HW (Kafka's maximal ISR) until ``.set_isr`` includes it (or,
      at a newer partition epoch, does not) or ``.expand_refused(replica_id)``;
      ``.pending_expansions``.
    - ``.set_isr(isr, now, partition_epoch=None)``: the ISR the metadata committed.
    - ``PendingAcks``: ``add(offset, token)``, ``release(hw) -> [(offset, token)]``,
      ``fail_all() -> [(offset, token)]`` (on losing leadership), ``len()``.

``lease``
    - ``lease_expiry(heard, leader, isr, *, joining, leaving, leader_timeout) -> float``: the
      leader clock reading at which enough ISR followers could have reported the leader for any
      ISR between the known one and the changes in flight; inf without followers.

``follower`` (one object per leader epoch; restart = new object)
    - ``Follower(replica_id, leader_id, leader_epoch, history, log_end_offset, hw, now, *,
      log_start_offset=0, config=FollowerConfig())``; ``FollowerConfig(leader_timeout=15,
      max_idle_wait=10, retry_backoff=0.5)``; attributes ``state`` (TRUNCATING / FETCHING /
      IDLE), ``log_end_offset``, ``history`` (own copy), ``hw``.
    - events, each returning a list of actions: ``start()``,
      ``on_epoch_answer(epoch, end_offset, now)``, ``on_epoch_query_failed(now)``,
      ``on_replicate(leader_epoch, leader_hw, entries=[(offset, epoch), ...], now, leader_time=0.0)``,
      ``on_fetch_failed(now)``, ``on_notify(now)``, ``tick(now)``; ``next_deadline() -> float``.
    - actions: ``SendEpochQuery(epoch)``, ``Truncate(end_offset, below_high_watermark)``,
      ``SendFetch(offset, leader_epoch, leader_time)``, ``Append(first_offset, count, epoch_starts)``,
      ``SetHighWatermark(hw)``, ``WaitForData(until)``, ``Pause(until)`` (before a failed request
      is asked again: ``retry_pause(failures, leader_timeout)``), ``ReportLeader(leader_id,
      leader_epoch)``. The shell applies Truncate/Append/SetHighWatermark to the real log in order.

``leader`` (``Leader``: one object per replica, across its leaderships; ``Leadership``: one per
leadership)
    - ``Leader(name, *, sync_always, concurrency_control)``, generic in the writes' outcome
      tokens; attributes ``leadership``, ``fenced_epoch``, ``acks_held``. Events, each returning
      a list of actions: ``lead(...)`` (Leadership's arguments), ``metadata_changed(isr,
      partition_epoch, min_isr, now, unclean)``, ``fence(epoch)``, ``step_down()``, ``close()``,
      ``fail(error)``; ``submit(records, token, expected)`` (queues, no actions), ``flush()``,
      ``appended(first_offset, log_end, now)``, ``append_failed(error)`` (the log is as it was),
      ``log_failed(cause)``, ``unencodable(records) -> (refusals, Append or None)``,
      ``synced(sync, now)``, ``sync_failed(sync, error)``, ``sync_cancelled(sync)``,
      ``fetched(replica_id, log_end_offset, leader_epoch, now, leader_time) -> (recorded,
      actions)``, ``isr_request_done(request, outcome, now)``, ``committed(hw)``.
    - actions: ``Append(records, leader_epoch)``, ``StartSync(leadership, writes, durable_end)``
      (handed back when it completes), ``Acknowledge([(offset, token)])``, ``Fail(tokens,
      error)``, ``Notify(followers)``, ``PublishHighWatermark(hw)`` (then ``committed(hw)``),
      ``StepDown(epoch)`` (fenced), ``Failed(cause)`` (record the log's failure, then ``fail``).
      The shell carries them out in order; a token's calls may add commits (``leadership.acks``).
    - ``start_leader_epoch(history, epoch, log_end_offset)``: before the first append.
    - ``Leadership(leader_id, leader_epoch, partition_epoch, replicas, isr, *, history,
      log_end_offset, hw, min_isr, max_lag_time, leader_timeout, now)``: starts the epoch, holds
      the ``tracker`` (IsrTracker) and the ``acks`` (PendingAcks); ``.holds_lease(now)``,
      ``.fenced_by(epoch)``,
      ``.metadata_changed(isr, partition_epoch, min_isr, now)``, ``.isr_requests(now) ->
      [IsrRequest(replica_id, add, leader_epoch, partition_epoch)]``,
      ``.isr_request_done(request, IsrOutcome.ACCEPTED/REFUSED/UNKNOWN)``.

``concurrency`` (Liftbridge's optimistic concurrency control)
    - ``admitted(next_offset, groups) -> list[bool]``: which groups of records (each a list of
      expected offsets, ``NO_EXPECTATION`` = -1 for any) the leader appends, in order, all or none
      each; ``Leader.flush`` applies it. ``IncorrectOffset``: a refused group's outcome. Whether
      a stream checks is its effective setting (``wire.settings.effective_settings``).

Elections (leader choice, witness reports, the returning-leader rule, ISR change validation)
are the metadata leader's: ``bascule.metadata.election``.

Protocol decisions taken here (see each module for the reasoning)
-----------------------------------------------------------------

- A follower truncates to min(leader's end, *its own end* of the answered epoch), not to
  min(leader's end, its LEO): when the answered epoch is older than the asked one, the
  follower's part of it may end earlier (its later epoch follows), and those entries diverge.
- A follower with no epoch in common with the leader (answer (-1, -1)) truncates to its log
  start; a follower's own HW is never a truncation point; a truncation below the HW lowers the
  HW and is flagged. ``Truncate`` is emitted even when no entry goes: it drops empty epochs the
  replica recorded as a leader, without which the leader's older-epoch entries would be refused.
- A follower's HW never moves backwards on a response (a new leader may report an older HW).
- The leader's HW waits for every ISR member to fetch once in a new leadership.
- ISR expansion needs a caught-up fetch that already holds every committed message and
  everything before the leader's epoch; while the request is in flight the replica counts for
  the HW, so the HW never passes the log end of a member the metadata is about to add. ISR
  changes are conditional on the leader epoch and the partition epoch; an expansion whose
  outcome is unknown keeps counting and is asked again until the metadata's ISR settles it; an
  ISR member found lacking committed messages is proposed for removal at once.
- Replies are judged on content: a valid replication reply is taken even while IDLE (a zombie
  may answer the shared subject first); invalid ones are dropped and are no leader contact.
- A write is acknowledged only in the leadership it was written in: a group-commit fsync that
  completes after that leadership ended acks nothing, even if a new one began; and only while the
  leader holds its lease (``lease``): no other leader can have been elected yet.
"""
