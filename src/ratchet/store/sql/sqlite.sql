-- Ratchet's queries, SQLite dialect.
--
-- SQLite serialises writers: every store transaction is BEGIN IMMEDIATE, so the checks
-- below (lease live, run not terminal) and the writes they guard cannot interleave with
-- another writer, in this process or another. Row locks spelled FOR UPDATE / FOR SHARE in
-- the PostgreSQL file are therefore absent here. ratchet_now() is registered on each
-- connection: the host's clock plus the store's injectable offset.
-- Lists are passed as JSON text and unpacked with json_each.

-- name: now
SELECT ratchet_now() AS now

-- name: run_insert
-- A child run belongs to its parent's tenant, whatever the caller passed.
INSERT INTO runs (run_id, workflow, workflow_version, input, status, parent_run_id,
                  parent_step_id, queue, priority, created_at, updated_at, tenant_id, tags,
                  concurrency_key)
VALUES (:run_id, :workflow, :workflow_version, :input, 'queued', :parent_run_id,
        :parent_step_id, :queue, :priority, ratchet_now(), ratchet_now(),
        COALESCE((SELECT tenant_id FROM runs WHERE run_id = :parent_run_id), :tenant_id),
        :tags, :concurrency_key)
ON CONFLICT (run_id) DO NOTHING

-- name: run_get
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs WHERE run_id = :run_id

-- name: run_get_locked
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key, cancel_requested, cancel_by
FROM runs WHERE run_id = :run_id

-- name: runs_get_many
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: runs_list
-- Newest first along runs_created; runs_list_status along runs_status.
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs ORDER BY created_at DESC, run_id LIMIT :limit

-- name: runs_list_status
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs WHERE status = :status
ORDER BY created_at DESC, run_id LIMIT :limit

-- name: runs_filter
-- runs_list with filters, each applied when given (NULL: any).
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs
WHERE (:status IS NULL OR status = :status)
  AND (:workflow IS NULL OR workflow = :workflow)
ORDER BY created_at DESC, run_id LIMIT :limit

-- name: runs_count_filter
SELECT count(*) FROM runs
WHERE (:status IS NULL OR status = :status)
  AND (:workflow IS NULL OR workflow = :workflow)

-- name: runs_filter_tagged
-- Runs with every tag of :tags (a JSON object), newest first. The tags are matched first,
-- along run_tags_match (a tag per key of :tags, every one found), and only the runs found
-- are read (CROSS JOIN keeps that order), then sorted: the cost follows the runs matched,
-- not the runs stored. The other filters apply when given (NULL: any), as in runs_page.
SELECT r.run_id, r.workflow, r.workflow_version, r.input, r.status, r.output, r.error,
       r.parent_run_id, r.parent_step_id, r.queue, r.priority, r.not_before, r.waiting_for,
       r.created_at, r.updated_at, r.tenant_id, r.tags, r.forked_from, r.forked_at, r.concurrency_key
FROM (SELECT t.run_id FROM json_each(:tags) AS j
      JOIN run_tags AS t ON t.key = j.key AND t.value = j.value
      GROUP BY t.run_id HAVING count(*) = (SELECT count(*) FROM json_each(:tags))) AS m
CROSS JOIN runs AS r ON r.run_id = m.run_id
WHERE (:status IS NULL OR r.status = :status)
  AND (:workflow IS NULL OR r.workflow = :workflow)
ORDER BY r.created_at DESC, r.run_id LIMIT :limit

-- name: runs_count_tagged
SELECT count(*)
FROM (SELECT t.run_id FROM json_each(:tags) AS j
      JOIN run_tags AS t ON t.key = j.key AND t.value = j.value
      GROUP BY t.run_id HAVING count(*) = (SELECT count(*) FROM json_each(:tags))) AS m
CROSS JOIN runs AS r ON r.run_id = m.run_id
WHERE (:status IS NULL OR r.status = :status)
  AND (:workflow IS NULL OR r.workflow = :workflow)

-- name: runs_finished
SELECT run_id FROM runs
WHERE run_id IN (SELECT value FROM json_each(:ids)) AND status IN ('succeeded', 'failed', 'cancelled')

-- name: events_load
-- The columns of PostgreSQL's events_load, in its order: a replay reads thousands of rows,
-- unpacked by position (payload_exact: SQLite keeps every payload as the text hashed).
SELECT run_id, seq, kind, step_id, attempt, payload, 1 AS payload_exact, at, prev_hash, hash
FROM journal_events WHERE run_id = :run_id AND seq > :after ORDER BY seq LIMIT :limit

-- name: requests_load
-- The model requests a run journaled (step_started's request) and the drifts a replay found,
-- in seq order: read once by a drive that makes a model call, to journal its own after them.
SELECT kind, step_id,
       CASE WHEN kind = 'step_started' THEN json_extract(payload, '$.request') ELSE payload END
         AS data
FROM journal_events
WHERE run_id = :run_id
  AND ((kind = 'step_started' AND json_extract(payload, '$.request') IS NOT NULL)
       OR kind = 'request_drifted')
ORDER BY seq

-- name: llm_calls_of_runs
-- The LLM usage and cost journaled in some runs (a model call's step_completed; the calls
-- made inside a step, with its end, retry included): run totals for a list of runs.
SELECT run_id, json_extract(payload, '$.llm') AS llm FROM journal_events
WHERE run_id IN (SELECT value FROM json_each(:ids))
  AND kind IN ('step_completed', 'step_failed', 'step_retrying')
  AND json_extract(payload, '$.llm') IS NOT NULL

-- name: event_last
SELECT seq, hash FROM journal_events WHERE run_id = :run_id ORDER BY seq DESC LIMIT 1

-- name: event_insert
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
VALUES (:run_id, :seq, :kind, :step_id, :attempt, :payload, :at, :prev_hash, :hash)

-- name: event_insert_leased
-- The per-step hot path: each row is inserted only if the lease is live and this holder's;
-- fewer rows than events means the lease was lost (the caller rolls back).
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
SELECT :run_id, :seq, :kind, :step_id, :attempt, :payload, :at, :prev_hash, :hash
WHERE EXISTS (
    SELECT 1 FROM run_locks
    WHERE run_id = :run_id AND worker_id = :worker_id AND epoch = :epoch
      AND expires_at > ratchet_now()
)

-- name: lease_check
SELECT 1 FROM run_locks
WHERE run_id = :run_id AND worker_id = :worker_id AND epoch = :epoch
  AND expires_at > ratchet_now()

-- name: lease_row_locked
SELECT worker_id, epoch, expires_at > ratchet_now() AS live FROM run_locks WHERE run_id = :run_id

-- name: lease_get
SELECT worker_id, epoch, expires_at > ratchet_now() AS live FROM run_locks WHERE run_id = :run_id

-- name: lease_retake
-- The holder drives its run again (its last drive was abandoned on a storage error): the
-- same worker, a new epoch, so whatever the abandoned drive still had in flight is fenced.
UPDATE run_locks SET epoch = epoch + 1, expires_at = ratchet_now() + :ttl
WHERE run_id = :run_id AND worker_id = :worker_id AND epoch = :epoch
RETURNING epoch

-- name: lease_release
UPDATE run_locks SET worker_id = NULL, expires_at = 0
WHERE run_id = :run_id AND worker_id = :worker_id AND epoch = :epoch

-- name: timers_due
-- Runs whose timer is due become queued, oldest timer first, along runs_timers; claims
-- then read only runs_queued, whatever the number of runs waiting on future timers.
-- (INDEXED BY: without ANALYZE statistics SQLite would pick runs_status and sort.)
UPDATE runs SET status = 'queued', waiting_for = NULL, not_before = NULL,
                updated_at = ratchet_now()
WHERE run_id IN (
    SELECT run_id FROM runs INDEXED BY runs_timers
    WHERE status = 'waiting' AND not_before <= (SELECT ratchet_now())
    ORDER BY not_before LIMIT :limit
)
RETURNING run_id

-- name: dedup_holder
-- The run holding a dedup id: of this tenant and workflow, not terminal (along runs_dedup).
SELECT run_id FROM runs
WHERE tenant_id = :tenant_id AND workflow = :workflow AND dedup_id = :dedup_id
  AND status NOT IN ('succeeded', 'failed', 'cancelled')

-- name: dedup_holder_of
-- Another run, not terminal, holding the dedup id of run_id (which a retry or a resume
-- would make not terminal again).
SELECT h.run_id FROM runs r
JOIN runs h ON h.tenant_id = r.tenant_id AND h.workflow = r.workflow AND h.dedup_id = r.dedup_id
WHERE r.run_id = :run_id AND r.dedup_id IS NOT NULL AND h.run_id <> r.run_id
  AND h.status NOT IN ('succeeded', 'failed', 'cancelled')

-- name: debounce_pending
-- The run collecting a debounce key's starts, not begun yet (along runs_debounce).
SELECT run_id FROM runs
WHERE tenant_id = :tenant_id AND workflow = :workflow AND debounce_key = :debounce_key
  AND status = 'waiting' AND waiting_for IS NULL

-- name: debounce_push
-- A start within the window: the latest input, and the window begins again.
UPDATE runs SET input = :input, not_before = :not_before, updated_at = ratchet_now()
WHERE run_id = :run_id AND status = 'waiting' AND waiting_for IS NULL

-- name: run_start_options
-- A run just inserted takes its dedup id and debounce key, and, when it may not begin
-- before a time, waits for it on no wait key until the timers make it queued.
UPDATE runs SET dedup_id = :dedup_id, debounce_key = :debounce_key,
                status = CASE WHEN :not_before IS NULL THEN status ELSE 'waiting' END,
                not_before = :not_before
WHERE run_id = :run_id AND status = 'queued'

-- name: claim_pick
-- One queue's ready runs of the workflows the worker serves, in runs_queued order.
-- (:served is a JSON list of [workflow, version] pairs.)
SELECT run_id, priority, created_at FROM runs INDEXED BY runs_queued
WHERE status = 'queued' AND queue = :queue
  AND (workflow, workflow_version) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:served))
ORDER BY priority DESC, created_at LIMIT :limit

-- name: steal_pick
SELECT r.run_id FROM runs r LEFT JOIN run_locks l ON l.run_id = r.run_id
WHERE r.status = 'running' AND r.queue IN (SELECT value FROM json_each(:queues))
  AND (l.run_id IS NULL OR l.expires_at <= ratchet_now())
  AND (r.workflow, r.workflow_version) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:served))
LIMIT :limit

-- name: reclaim_pick
SELECT l.run_id FROM run_locks l JOIN runs r ON r.run_id = l.run_id
WHERE l.worker_id = :worker_id AND r.status = 'running'
  AND (r.workflow, r.workflow_version) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:served))

-- name: runs_set_running
UPDATE runs SET status = 'running', waiting_for = NULL, not_before = NULL,
                updated_at = ratchet_now()
WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: leases_take
-- A new lease row continues above the highest epoch the run ever handed out.
INSERT INTO run_locks (run_id, worker_id, epoch, expires_at)
SELECT run_id, :worker_id, lease_epoch + 1, ratchet_now() + :ttl FROM runs
WHERE run_id IN (SELECT value FROM json_each(:ids))
ON CONFLICT (run_id) DO UPDATE
SET worker_id = excluded.worker_id, epoch = run_locks.epoch + 1, expires_at = excluded.expires_at
-- Judged on the lease as committed now, not as the pick saw it: of two sweepers that
-- picked the same expired lease, the second finds it live and takes nothing.
WHERE run_locks.expires_at <= ratchet_now() OR run_locks.worker_id = excluded.worker_id
RETURNING run_id, epoch

-- name: leases_renew
UPDATE run_locks SET expires_at = ratchet_now() + :ttl
WHERE worker_id = :worker_id AND run_id IN (SELECT value FROM json_each(:ids))

-- name: leases_held
-- With who asked for a pending cancel: the renewal that finds it tells the drive.
SELECT l.run_id, l.epoch, r.cancel_requested, r.cancel_by
FROM run_locks l JOIN runs r ON r.run_id = l.run_id
WHERE l.worker_id = :worker_id AND l.run_id IN (SELECT value FROM json_each(:ids))

-- name: runs_requeue_worker
UPDATE runs SET status = 'queued', updated_at = ratchet_now()
WHERE status = 'running'
  AND run_id IN (SELECT run_id FROM run_locks WHERE worker_id = :worker_id)

-- name: leases_release_worker
UPDATE run_locks SET worker_id = NULL, expires_at = 0 WHERE worker_id = :worker_id

-- name: run_park
UPDATE runs SET status = 'waiting', waiting_for = :waiting_for, not_before = :not_before,
                updated_at = ratchet_now()
WHERE run_id = :run_id AND status = 'running'

-- name: run_wake
-- A run parked on several waits at once (any:[...]) wakes for whichever comes first.
UPDATE runs SET status = 'queued', waiting_for = NULL, not_before = NULL,
                updated_at = ratchet_now()
WHERE run_id = :run_id AND status = 'waiting'
  AND (waiting_for = :waiting_for OR waiting_for LIKE 'any:%')

-- name: run_requeue
UPDATE runs SET status = 'queued', output = NULL, error = NULL, waiting_for = NULL,
                not_before = NULL, cancel_requested = 0, cancel_by = NULL,
                updated_at = ratchet_now()
WHERE run_id = :run_id AND status = 'failed'

-- name: run_resume
-- A cancelled run queued again (ratchet.store.forks.resume): the same row, from where its
-- journal left off.
UPDATE runs SET status = 'queued', output = NULL, error = NULL, waiting_for = NULL,
                not_before = NULL, cancel_requested = 0, cancel_by = NULL,
                updated_at = ratchet_now()
WHERE run_id = :run_id AND status = 'cancelled'

-- name: fork_insert
-- A fork (ratchet.store.forks): a new top-level run with its lineage.
INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, priority,
                  created_at, updated_at, tenant_id, tags, forked_from, forked_at, concurrency_key)
VALUES (:run_id, :workflow, :workflow_version, :input, 'queued', :queue, :priority,
        ratchet_now(), ratchet_now(), :tenant_id, :tags, :forked_from, :forked_at, :concurrency_key)

-- name: run_finish
-- Keeps the lease's epoch (the row goes with lease_drop in the same transaction).
UPDATE runs SET status = :status, output = :output, error = :error, waiting_for = NULL,
                not_before = NULL, cancel_requested = 0, cancel_by = NULL,
                updated_at = ratchet_now(),
                lease_epoch = coalesce(
                    (SELECT epoch FROM run_locks WHERE run_id = :run_id), lease_epoch)
WHERE run_id = :run_id AND status NOT IN ('succeeded', 'failed', 'cancelled')

-- name: lease_drop
DELETE FROM run_locks WHERE run_id = :run_id

-- name: signals_drop_consumed
DELETE FROM signals WHERE run_id = :run_id AND consumed_seq IS NOT NULL

-- name: run_cancel_request
-- The first name given stays: who asked first cancelled it.
UPDATE runs SET cancel_requested = 1, cancel_by = COALESCE(cancel_by, :by),
                updated_at = ratchet_now()
WHERE run_id = :run_id

-- name: signal_insert
INSERT INTO signals (run_id, name, payload, sent_at)
VALUES (:run_id, :name, :payload, ratchet_now())

-- name: signal_pending
SELECT id, payload FROM signals
WHERE run_id = :run_id AND name = :name AND consumed_seq IS NULL ORDER BY id LIMIT 1

-- name: signal_consume
UPDATE signals SET consumed_seq = :seq
WHERE run_id = :run_id AND id = :id AND consumed_seq IS NULL

-- name: dead_letter_put
INSERT INTO dead_letters (run_id, reason, error, at) VALUES (:run_id, :reason, :error, ratchet_now())
ON CONFLICT (run_id) DO UPDATE SET reason = excluded.reason, error = excluded.error, at = excluded.at

-- name: dead_letter_delete
DELETE FROM dead_letters WHERE run_id = :run_id

-- name: dead_letters_list
SELECT d.run_id, r.workflow, d.reason, d.error, d.at
FROM dead_letters d JOIN runs r ON r.run_id = d.run_id ORDER BY d.at DESC LIMIT :limit

-- name: runs_count
-- Listings say how many there are when they show fewer (``ratchet runs``, ``ratchet dlq``).
SELECT count(*) FROM runs

-- name: runs_count_by_status
SELECT count(*) FROM runs WHERE status = :status

-- name: dead_letters_count
SELECT count(*) FROM dead_letters

-- A receipt's identity is (run_id, step_id, delivery); its key is the one sent out, derived
-- from the attempt that first claimed it. A claim that conflicts with either (a later
-- attempt of the same delivery, or a re-drive of the attempt that claimed it) inserts
-- nothing, and the claimer reads the receipt back.

-- name: receipt_get
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts WHERE idempotency_key = :key

-- name: receipt_get_locked
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts WHERE idempotency_key = :key

-- name: receipt_find
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts
WHERE run_id = :run_id AND step_id = :step_id AND delivery = :delivery

-- name: receipt_claim
INSERT INTO side_effect_receipts (idempotency_key, run_id, step_id, delivery, attempt, status,
                                  epoch, claimed_at)
VALUES (:key, :run_id, :step_id, :delivery, :attempt, 'claimed',
        :epoch, ratchet_now())
ON CONFLICT DO NOTHING

-- name: receipt_reclaim
UPDATE side_effect_receipts SET epoch = :epoch, claimed_at = ratchet_now()
WHERE idempotency_key = :key AND status = 'claimed'

-- name: receipt_settle
UPDATE side_effect_receipts SET status = 'settled', response = :response, epoch = :epoch,
                                settled_by = 'worker', settled_at = ratchet_now()
WHERE idempotency_key = :key AND status = 'claimed'

-- name: receipt_resolve
-- By hand: no lease and no epoch of its own (the caller checked the run is not being driven).
UPDATE side_effect_receipts SET status = :status, response = :response,
                                settled_by = 'hand', settled_at = ratchet_now()
WHERE idempotency_key = :key AND status = 'claimed'

-- name: receipts_list
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts WHERE run_id = :run_id ORDER BY claimed_at, step_id, delivery

-- name: worker_upsert
INSERT INTO workers (worker_id, host, pid, started_at, seen_at, serves, queues, lease_ttl,
                     liveness_lock)
VALUES (:worker_id, :host, :pid, ratchet_now(), ratchet_now(), :serves, :queues, :lease_ttl,
        :liveness_lock)
ON CONFLICT (worker_id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
    seen_at = excluded.seen_at, serves = excluded.serves, queues = excluded.queues,
    lease_ttl = excluded.lease_ttl, liveness_lock = excluded.liveness_lock

-- name: worker_get
SELECT host, pid FROM workers WHERE worker_id = :worker_id

-- name: workers_locking
-- The workers that took a liveness lock (migration 017), whose locks store/liveness.py tests.
SELECT worker_id FROM workers WHERE liveness_lock AND worker_id <> :worker_id

-- name: takeover_pick
SELECT r.run_id FROM run_locks l JOIN runs r ON r.run_id = l.run_id
WHERE l.worker_id IN (SELECT value FROM json_each(:dead)) AND r.status = 'running'
  AND r.queue IN (SELECT value FROM json_each(:queues))
  AND (r.workflow, r.workflow_version) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:served))
LIMIT :limit

-- name: leases_take_over
-- The dead holder's lease, live or not, one epoch up: whatever it might still write is
-- fenced off.
UPDATE run_locks
SET worker_id = :worker_id, epoch = epoch + 1, expires_at = ratchet_now() + :ttl
WHERE run_id IN (SELECT value FROM json_each(:ids))
  AND worker_id IN (SELECT value FROM json_each(:dead))
RETURNING run_id, epoch

-- name: workers_forget
-- Dead workers left with no lease: their rows go (a restart writes its own again).
DELETE FROM workers
WHERE worker_id IN (SELECT value FROM json_each(:dead))
  AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.worker_id = workers.worker_id)

-- name: worker_seen
UPDATE workers SET seen_at = ratchet_now() WHERE worker_id = :worker_id

-- name: run_hand_back
UPDATE runs SET status = 'queued', updated_at = ratchet_now()
WHERE run_id = :run_id AND status = 'running'

-- name: runs_children_active
SELECT run_id FROM runs
WHERE parent_run_id = :run_id AND status NOT IN ('succeeded', 'failed', 'cancelled')
ORDER BY run_id

-- name: worker_delete
DELETE FROM workers WHERE worker_id = :worker_id

-- name: workers_prune
-- Workers not seen for many of their own TTLs are gone (a live one renews every ttl/3).
DELETE FROM workers WHERE seen_at + lease_ttl * :ttls < ratchet_now()

-- name: workers_live
SELECT worker_id, host, pid, serves, queues, lease_ttl, seen_at FROM workers
WHERE seen_at + lease_ttl > ratchet_now() ORDER BY worker_id

-- Approvals (migration 005): a row per approval step, written with the step_waiting that
-- asks, decided at most once (every decision is an update guarded by status = 'pending').

-- name: approval_ask
-- A new ask, or the same step asked again by a later attempt (a retry of the run after its
-- approval timed out): the row starts over. A re-drive asking the same attempt keeps it.
INSERT INTO approvals (run_id, step_id, attempt, name, data, root_run_id, asked_at, deadline)
VALUES (:run_id, :step_id, :attempt, :name, :data, :root_run_id, ratchet_now(), :deadline)
ON CONFLICT (run_id, step_id) DO UPDATE
SET attempt = excluded.attempt, name = excluded.name, data = excluded.data,
    asked_at = excluded.asked_at, deadline = excluded.deadline, status = 'pending',
    decided_by = NULL, comment = NULL, decided_at = NULL, granted = NULL
WHERE approvals.attempt < excluded.attempt

-- name: approval_get
SELECT a.run_id, a.step_id, a.attempt, a.name, a.data, a.root_run_id, a.asked_at,
       a.deadline, a.status, a.decided_by, a.comment, a.decided_at, a.note, a.granted,
       r.parent_run_id
FROM approvals a JOIN runs r ON r.run_id = a.run_id
WHERE a.run_id = :run_id AND a.step_id = :step_id

-- name: approvals_named
SELECT a.run_id, a.step_id, a.attempt, a.name, a.data, a.root_run_id, a.asked_at,
       a.deadline, a.status, a.decided_by, a.comment, a.decided_at, a.note, a.granted,
       r.parent_run_id
FROM approvals a JOIN runs r ON r.run_id = a.run_id
WHERE a.run_id = :run_id AND a.name = :name ORDER BY a.asked_at, a.step_id

-- name: approval_decide
-- :grant is what approving a guard's pause lets the run go over to (migration 016).
UPDATE approvals SET status = :status, decided_by = :by, comment = :comment,
                     note = :note,
                     decided_at = ratchet_now(), granted = :grant
WHERE run_id = :run_id AND step_id = :step_id AND attempt = :attempt AND status = 'pending'

-- name: approval_expire
UPDATE approvals SET status = 'expired', decided_at = ratchet_now()
WHERE run_id = :run_id AND step_id = :step_id AND attempt = :attempt AND status = 'pending'

-- name: approvals_pending
-- Pending approvals of unfinished runs, oldest first; with :run_id, only that run's and
-- those of the runs under it (its children, theirs, ...).
SELECT a.run_id, a.step_id, a.attempt, a.name, a.data, a.root_run_id, a.asked_at,
       a.deadline, a.status, a.decided_by, a.comment, a.decided_at, a.note, a.granted,
       r.parent_run_id
FROM approvals a JOIN runs r ON r.run_id = a.run_id
WHERE a.status = 'pending' AND r.status NOT IN ('succeeded', 'failed', 'cancelled')
  AND (:run_id IS NULL OR a.run_id = :run_id OR a.root_run_id = :run_id
       OR substr(a.run_id, 1, length(:run_id) + 1) = :run_id || '/')
ORDER BY a.asked_at, a.run_id, a.step_id LIMIT :limit

-- Graphs (migration 006): registered graph versions, keyed by content hash. Registering
-- a version again keeps its first registration time.
-- name: graph_insert
INSERT INTO graphs (name, version, definition, registered_at)
VALUES (:name, :version, :definition, ratchet_now())
ON CONFLICT (name, version) DO NOTHING

-- name: graph_get
SELECT name, version, definition, registered_at FROM graphs
WHERE name = :name AND version = :version

-- name: graph_latest
SELECT name, version, definition, registered_at FROM graphs WHERE name = :name
ORDER BY registered_at DESC, version LIMIT 1

-- name: graphs_list
-- Every version of every graph, newest first within a name.
SELECT name, version, definition, registered_at FROM graphs
ORDER BY name, registered_at DESC, version

-- name: events_heads
-- The last seq of each of some runs: one shared poll tells every tail in this process
-- which runs other processes appended to.
SELECT run_id, MAX(seq) AS seq FROM journal_events
WHERE run_id IN (SELECT value FROM json_each(:ids)) GROUP BY run_id

-- name: token_insert
-- expires_in: seconds from now on the database's clock (NULL: never expires).
INSERT INTO api_tokens (token_id, token_hash, tenant_id, scopes, name, created_at,
                        expires_at)
VALUES (:token_id, :token_hash, :tenant_id, :scopes, :name, ratchet_now(),
        ratchet_now() + :expires_in)

-- name: token_by_hash
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens
WHERE token_hash = :token_hash AND revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > ratchet_now())

-- name: tokens_list
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens
ORDER BY created_at, token_id

-- name: token_revoke
UPDATE api_tokens SET revoked_at = ratchet_now()
WHERE token_id = :token_id AND revoked_at IS NULL

-- name: token_get
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens
WHERE token_id = :token_id

-- name: tokens_of_tenant
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens WHERE tenant_id = :tenant_id
ORDER BY created_at, token_id

-- name: tokens_ended
-- Of the tokens that open event streams stand for: whether each is revoked or expired by
-- now, and when it expires (the streams' watch sleeps until the next expiry at most).
SELECT token_id, (revoked_at IS NOT NULL OR expires_at <= ratchet_now()) AS ended, expires_at
FROM api_tokens WHERE token_id IN (SELECT value FROM json_each(:ids))

-- Tenant-scoped run ids (migration 015; ratchet.store.tenants) ---------------------------

-- name: tenant_legacy_ids
SELECT tenant_id FROM tenant_legacy_ids

-- name: run_owners
SELECT run_id, tenant_id FROM runs WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: runs_page
-- A tenant's runs, newest first, after a (created_at, run_id) cursor; each filter applies
-- when given (NULL: any); text: a substring of the run id (instr: no wildcards).
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs
WHERE tenant_id = :tenant_id
  AND (:status IS NULL OR status = :status)
  AND (:workflow IS NULL OR workflow = :workflow)
  AND (:parent IS NULL OR parent_run_id = :parent)
  AND (:text IS NULL OR instr(run_id, :text) > 0)
  AND (:created_after IS NULL OR created_at >= :created_after)
  AND (:created_before IS NULL OR created_at < :created_before)
  AND (:cursor_at IS NULL OR created_at < :cursor_at
       OR (created_at = :cursor_at AND run_id > :cursor_id))
ORDER BY created_at DESC, run_id LIMIT :limit

-- name: runs_page_tagged
-- runs_page of the runs with every tag of :tags, matched as in runs_filter_tagged.
SELECT r.run_id, r.workflow, r.workflow_version, r.input, r.status, r.output, r.error,
       r.parent_run_id, r.parent_step_id, r.queue, r.priority, r.not_before, r.waiting_for,
       r.created_at, r.updated_at, r.tenant_id, r.tags, r.forked_from, r.forked_at, r.concurrency_key
FROM (SELECT t.run_id FROM json_each(:tags) AS j
      JOIN run_tags AS t ON t.key = j.key AND t.value = j.value
      GROUP BY t.run_id HAVING count(*) = (SELECT count(*) FROM json_each(:tags))) AS m
CROSS JOIN runs AS r ON r.run_id = m.run_id
WHERE r.tenant_id = :tenant_id
  AND (:status IS NULL OR r.status = :status)
  AND (:workflow IS NULL OR r.workflow = :workflow)
  AND (:parent IS NULL OR r.parent_run_id = :parent)
  AND (:text IS NULL OR instr(r.run_id, :text) > 0)
  AND (:created_after IS NULL OR r.created_at >= :created_after)
  AND (:created_before IS NULL OR r.created_at < :created_before)
  AND (:cursor_at IS NULL OR r.created_at < :cursor_at
       OR (r.created_at = :cursor_at AND r.run_id > :cursor_id))
ORDER BY r.created_at DESC, r.run_id LIMIT :limit

-- name: dead_letters_of_tenant
SELECT d.run_id, r.workflow, d.reason, d.error, d.at
FROM dead_letters d JOIN runs r ON r.run_id = d.run_id
WHERE r.tenant_id = :tenant_id ORDER BY d.at DESC LIMIT :limit

-- Server readiness (/readyz) ----------------------------------------------------------

-- name: migrations_applied
SELECT version FROM schema_migrations

-- Dashboard (ratchet server's pages): browser sessions and the list page's reads.

-- name: ui_session_insert
-- Expired sessions go as new ones come, so the table holds only live ones and a few more.
INSERT INTO ui_sessions (session_hash, token_id, created_at, expires_at)
VALUES (:session_hash, :token_id, ratchet_now(), ratchet_now() + :ttl_s)

-- name: ui_sessions_expire
DELETE FROM ui_sessions WHERE expires_at <= ratchet_now()

-- name: ui_session_token
-- The live token behind a live session: an expired session or a revoked token is none.
SELECT t.token_id, t.tenant_id, t.scopes, t.name, t.created_at, t.revoked_at,
       t.expires_at
FROM ui_sessions s JOIN api_tokens t ON t.token_id = s.token_id
WHERE s.session_hash = :session_hash AND s.expires_at > ratchet_now()
  AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > ratchet_now())

-- name: ui_session_delete
DELETE FROM ui_sessions WHERE session_hash = :session_hash

-- name: ui_status_counts
SELECT status, COUNT(*) AS n FROM runs WHERE tenant_id = :tenant_id GROUP BY status

-- name: ui_runs_changed
-- What the live list compares between polls: the run that changed last. A start adds a row
-- and every status change moves updated_at, so either moves this answer; read from the end
-- of runs_tenant_changed, it costs one index seek however many runs the tenant has.
SELECT run_id, updated_at AS changed FROM runs WHERE tenant_id = :tenant_id
ORDER BY updated_at DESC, run_id DESC LIMIT 1

-- name: ui_step_counts
SELECT run_id, COUNT(DISTINCT step_id) AS steps FROM journal_events
WHERE run_id IN (SELECT value FROM json_each(:ids)) AND kind = 'step_started'
GROUP BY run_id

-- name: ui_timeline_events
-- A journal as the waterfall reads it: every event's time, kind and step; of a step_started
-- only the two fields the waterfall reads (its kind, a child's run id), extracted here so a
-- long journal's thousands of starts are not parsed in Python; the whole payload only of
-- the rare kinds whose payload the waterfall and the run's story read (not the outputs of
-- completed steps, most of a long journal's bytes).
SELECT seq, kind, step_id, attempt, at,
       CASE WHEN kind IN ('step_waiting', 'run_started', 'run_resumed', 'run_queued',
                          'run_failed', 'run_cancelled', 'step_failed', 'anomaly_detected',
                          'confidence_evaluated', 'confidence_gate_bypassed')
            THEN payload END AS payload,
       CASE WHEN kind = 'step_started' THEN json_extract(payload, '$.kind') END AS step_kind,
       CASE WHEN kind = 'step_started' THEN json_extract(payload, '$.child_run_id') END AS child_run_id
FROM journal_events WHERE run_id = :run_id AND seq <= :upto ORDER BY seq

-- Guards (issue 12) -------------------------------------------------------------------------

-- name: guard_retries_recent
-- A workflow's retries within the last window_s seconds, across its runs and workers.
SELECT count(*) AS n FROM journal_events e JOIN runs r ON r.run_id = e.run_id
WHERE e.kind = 'step_retrying' AND e.at >= ratchet_now() - :window_s
  AND r.workflow = :workflow

-- name: guard_llm_history
-- The LLM calls of a workflow's last `limit` finished runs (a run without any: one row
-- whose llm is NULL), for the spike guards' medians.
SELECT r.run_id, e.step_id, json_extract(e.payload, '$.llm') AS llm
FROM (SELECT run_id FROM runs
      WHERE workflow = :workflow AND status IN ('succeeded', 'failed')
      ORDER BY updated_at DESC LIMIT :limit) r
LEFT JOIN journal_events e ON e.run_id = r.run_id AND e.kind = 'step_completed'
     AND json_extract(e.payload, '$.llm') IS NOT NULL

-- Signed run receipts and retention (migration 009). A receipt covers the journal up to
-- its seq; a newer one (the run ended again after a retry) replaces an older one, never the
-- reverse. Pruning deletes a finished run's journal in small transactions, after checking
-- that its receipt covers the whole journal; the receipt, the runs row and its delivery
-- receipts stay.

-- name: run_receipt_put
INSERT INTO run_receipts (run_id, seq, key_id, envelope, signed_at)
VALUES (:run_id, :seq, :key_id, :envelope, ratchet_now())
ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, key_id = excluded.key_id,
    envelope = excluded.envelope, signed_at = excluded.signed_at
WHERE run_receipts.seq < excluded.seq

-- name: run_receipt_get
SELECT run_id, seq, key_id, envelope, signed_at FROM run_receipts WHERE run_id = :run_id

-- name: run_pruned_at
SELECT pruned_at FROM runs WHERE run_id = :run_id

-- name: prune_candidates
-- Finished runs past the cutoff, oldest first, with the seq their receipt covers (NULL: no
-- receipt yet) and their journal's last seq.
SELECT r.run_id, k.seq AS receipt_seq,
       (SELECT max(seq) FROM journal_events j WHERE j.run_id = r.run_id) AS last_seq
FROM runs r LEFT JOIN run_receipts k ON k.run_id = r.run_id
WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.pruned_at IS NULL
  AND r.status IN (SELECT value FROM json_each(:statuses)) AND r.updated_at < :before
ORDER BY r.updated_at LIMIT :limit

-- name: prune_count
SELECT count(*) AS runs,
       sum((SELECT max(seq) FROM journal_events j WHERE j.run_id = r.run_id)) AS events
FROM runs r
WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.pruned_at IS NULL
  AND r.status IN (SELECT value FROM json_each(:statuses)) AND r.updated_at < :before

-- name: prune_mark
-- Only a run whose receipt covers its whole journal; a run re-queued meanwhile is no longer
-- finished and is left alone.
UPDATE runs SET pruned_at = ratchet_now()
WHERE run_id IN (SELECT value FROM json_each(:ids))
  AND status IN ('succeeded', 'failed', 'cancelled') AND pruned_at IS NULL
  AND EXISTS (SELECT 1 FROM run_receipts k WHERE k.run_id = runs.run_id
              AND k.seq = (SELECT max(seq) FROM journal_events j WHERE j.run_id = runs.run_id))
RETURNING run_id

-- name: prune_dead_letters
DELETE FROM dead_letters WHERE run_id IN (SELECT value FROM json_each(:ids))

-- name: prune_in_progress
SELECT run_id FROM runs WHERE pruned_at IS NOT NULL AND journal_pruned = 0 LIMIT :limit

-- name: prune_events
DELETE FROM journal_events WHERE (run_id, seq) IN (
    SELECT run_id, seq FROM journal_events
    WHERE run_id IN (SELECT value FROM json_each(:ids)) LIMIT :limit)

-- name: prune_done
UPDATE runs SET journal_pruned = 1 WHERE run_id IN (SELECT value FROM json_each(:ids))

-- Sandboxes (the isolated tier, migration 010): one row per sandbox spawned for a run.
-- name: sandboxes_end_stale
-- Rows a dead owner left open: a sandbox lives only while its owner holds the lease, so
-- once another holder runs the run, no earlier sandbox of it is alive.
UPDATE sandboxes SET status = 'terminated', ended_at = ratchet_now(), end_reason = 'orphaned'
WHERE run_id = :run_id AND status <> 'terminated'

-- name: sandbox_attempts
-- Sandboxes that count against the run's resume limit: those of lease epochs from :since
-- on (after a manual retry, the drives since), but for those a worker's clean shutdown
-- stopped; and the highest attempt number so far.
SELECT count(CASE WHEN coalesce(end_reason, '') <> 'shutdown' AND epoch >= :since
                   THEN 1 END) AS counted,
       coalesce(max(attempt), 0) AS last
FROM sandboxes WHERE run_id = :run_id

-- name: sandbox_insert
INSERT INTO sandboxes (sandbox_id, run_id, attempt, backend, worker_id, epoch, started_at)
VALUES (:sandbox_id, :run_id, :attempt, :backend, :worker_id, :epoch, ratchet_now())

-- name: sandbox_running
UPDATE sandboxes SET status = 'running' WHERE sandbox_id = :sandbox_id AND status = 'starting'

-- name: sandbox_end
UPDATE sandboxes SET status = 'terminated', ended_at = ratchet_now(), exit_code = :exit_code,
       signal = :signal, peak_memory = :peak_memory, end_reason = :end_reason
WHERE sandbox_id = :sandbox_id AND status <> 'terminated'

-- name: sandboxes_of_run
SELECT sandbox_id, run_id, attempt, status, backend, worker_id, epoch, started_at, ended_at,
       exit_code, signal, peak_memory, end_reason
FROM sandboxes WHERE run_id = :run_id ORDER BY attempt

-- name: sandboxes_recent
SELECT sandbox_id, run_id, attempt, status, backend, worker_id, epoch, started_at, ended_at,
       exit_code, signal, peak_memory, end_reason
FROM sandboxes ORDER BY started_at DESC, sandbox_id LIMIT :limit

-- name: sandboxes_of_run_attempt
SELECT sandbox_id, run_id, attempt, status, backend, worker_id, epoch, started_at, ended_at,
       exit_code, signal, peak_memory, end_reason
FROM sandboxes WHERE run_id = :run_id AND attempt = :attempt

-- Dashboard follow-ups (issue 11) -----------------------------------------------------------

-- name: ui_dead_lettered
SELECT count(*) AS n FROM dead_letters WHERE run_id = :run_id

-- Isolated graphs ---------------------------------------------------------------------------
-- A worker that cannot make sandboxes serves the graph versions without `tier: isolated`
-- only; one read answers both (every version, and whether it is isolated).

-- name: graph_versions_tiers
SELECT name, version,
       coalesce(json_extract(definition, '$.tier') = 'isolated', 0) AS isolated
FROM graphs

-- Schedules (ratchet.store.schedules): one row per tenant and schedule name.

-- name: schedule_declare
-- A schedule declared in code, written by each worker that has it: its spec follows the
-- code, its pause and last fired tick stay; one added through the API under that name
-- stays the API's.
INSERT INTO schedules (tenant_id, name, workflow, cron, every_s, tz, missed, source, paused,
                       created_at, last_tick)
VALUES (:tenant_id, :name, :workflow, :cron, :every_s, :tz, :missed, 'code', 0, :now, NULL)
ON CONFLICT (tenant_id, name) DO UPDATE
SET workflow = excluded.workflow, cron = excluded.cron, every_s = excluded.every_s,
    tz = excluded.tz, missed = excluded.missed
WHERE schedules.source = 'code'

-- name: schedule_add
INSERT INTO schedules (tenant_id, name, workflow, cron, every_s, tz, missed, source, paused,
                       created_at, last_tick)
VALUES (:tenant_id, :name, :workflow, :cron, :every_s, :tz, :missed, 'api', 0, :now, NULL)
ON CONFLICT (tenant_id, name) DO NOTHING

-- name: schedule_change
UPDATE schedules
SET workflow = :workflow, cron = :cron, every_s = :every_s, tz = :tz, missed = :missed
WHERE tenant_id = :tenant_id AND name = :name

-- name: schedule_delete
DELETE FROM schedules WHERE tenant_id = :tenant_id AND name = :name

-- name: schedules_all
-- What every worker's scheduler reads each pass: every schedule of every tenant.
SELECT tenant_id, name, workflow, cron, every_s, tz, missed, source, paused, created_at,
       last_tick
FROM schedules ORDER BY tenant_id, name

-- name: schedules_of_tenant
SELECT tenant_id, name, workflow, cron, every_s, tz, missed, source, paused, created_at,
       last_tick
FROM schedules WHERE tenant_id = :tenant_id ORDER BY name

-- name: schedule_get
SELECT tenant_id, name, workflow, cron, every_s, tz, missed, source, paused, created_at,
       last_tick
FROM schedules WHERE tenant_id = :tenant_id AND name = :name

-- name: schedule_advance
-- Only forward: a slower worker that fired an older tick never moves it back.
UPDATE schedules SET last_tick = :tick
WHERE tenant_id = :tenant_id AND name = :name AND (last_tick IS NULL OR last_tick < :tick)

-- name: schedule_pause
UPDATE schedules SET paused = 1 WHERE tenant_id = :tenant_id AND name = :name

-- name: schedule_resume
-- The ticks that passed while paused are not owed: the schedule goes on from the tick given.
UPDATE schedules
SET paused = 0,
    last_tick = CASE WHEN last_tick IS NULL OR last_tick < :tick THEN :tick ELSE last_tick END
WHERE tenant_id = :tenant_id AND name = :name

-- Queues (migration 021, ratchet.store.queues): limits every claimer of a limited queue
-- reads in its claim transaction (BEGIN IMMEDIATE: claimers take turns).

-- name: queue_declare
-- An app's declaration; limits last changed through the API stand.
INSERT INTO queues (name, concurrency, per_key_concurrency, rate_limit, rate_per_s,
                    hold_while_parked, set_by, updated_at)
VALUES (:name, :concurrency, :per_key_concurrency, :rate_limit, :rate_per_s,
        :hold_while_parked, :set_by, ratchet_now())
ON CONFLICT (name) DO UPDATE
SET concurrency = excluded.concurrency, per_key_concurrency = excluded.per_key_concurrency,
    rate_limit = excluded.rate_limit, rate_per_s = excluded.rate_per_s,
    hold_while_parked = excluded.hold_while_parked, updated_at = excluded.updated_at
WHERE queues.set_by <> 'api'

-- name: queue_set
UPDATE queues SET concurrency = :concurrency, per_key_concurrency = :per_key_concurrency,
                  rate_limit = :rate_limit, rate_per_s = :rate_per_s,
                  hold_while_parked = :hold_while_parked, set_by = :set_by,
                  updated_at = ratchet_now()
WHERE name = :name

-- name: queue_lock
SELECT name, concurrency, per_key_concurrency, rate_limit, rate_per_s, hold_while_parked
FROM queues WHERE name = :name

-- name: queues_list
SELECT q.name, q.concurrency, q.per_key_concurrency, q.rate_limit, q.rate_per_s,
       q.hold_while_parked, q.set_by,
       (SELECT count(*) FROM runs WHERE queue = q.name AND status = 'queued') AS depth,
       (SELECT count(*) FROM runs WHERE queue = q.name
          AND (status = 'running' OR (q.hold_while_parked AND status = 'waiting'
                                        AND waiting_for IS NOT NULL))) AS in_flight
FROM queues q ORDER BY q.name

-- name: queues_limited
SELECT name FROM queues
WHERE name IN (SELECT value FROM json_each(:queues))
  AND (concurrency IS NOT NULL OR per_key_concurrency IS NOT NULL OR rate_limit IS NOT NULL)

-- name: queue_usage
SELECT (SELECT count(*) FROM runs
        WHERE queue = :queue AND status IN (SELECT value FROM json_each(:statuses))
          -- a delayed or debounced start waits on no key: not begun, it holds no slot
          AND NOT (status = 'waiting' AND waiting_for IS NULL)) AS in_flight,
       (SELECT count(*) FROM runs
        WHERE queue = :queue AND first_started_at > ratchet_now() - :per_s) AS started

-- name: queue_pick
-- A limited queue's ready runs in priority then age order, those whose key has
-- per_key_concurrency runs in flight already left out (each key's n-th ready run is
-- eligible while the key's runs in flight plus n stay within it). With fresh false, only
-- runs driven before (the rate allows no first drive now).
WITH busy AS (
    SELECT concurrency_key, count(*) AS n FROM runs
    WHERE queue = :queue AND status IN (SELECT value FROM json_each(:statuses))
      AND NOT (status = 'waiting' AND waiting_for IS NULL)
      AND concurrency_key IS NOT NULL
    GROUP BY concurrency_key
), ready AS (
    SELECT run_id, priority, created_at, concurrency_key,
           first_started_at IS NOT NULL AS started,
           row_number() OVER (PARTITION BY concurrency_key
                              ORDER BY priority DESC, created_at, run_id) AS nth
    FROM runs INDEXED BY runs_queued
    WHERE status = 'queued' AND queue = :queue
      AND (:fresh OR first_started_at IS NOT NULL)
      AND (workflow, workflow_version) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:served))
)
SELECT ready.run_id, ready.priority, ready.created_at, ready.started
FROM ready LEFT JOIN busy ON busy.concurrency_key = ready.concurrency_key
WHERE :per_key IS NULL OR ready.concurrency_key IS NULL
   OR ready.nth + coalesce(busy.n, 0) <= :per_key
ORDER BY ready.priority DESC, ready.created_at, ready.run_id
LIMIT :limit

-- name: queue_lock_runs
SELECT run_id FROM runs
WHERE run_id IN (SELECT value FROM json_each(:ids)) AND status = 'queued'

-- name: runs_mark_started
UPDATE runs SET first_started_at = ratchet_now()
WHERE run_id IN (SELECT value FROM json_each(:ids)) AND first_started_at IS NULL

-- name: run_first_started
SELECT first_started_at FROM runs WHERE run_id = :run_id

-- name: runs_keys
SELECT concurrency_key FROM runs WHERE queue = :queue
