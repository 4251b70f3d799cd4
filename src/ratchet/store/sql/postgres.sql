-- Ratchet's queries, PostgreSQL dialect.
--
-- Many workers on many machines share one database, so every decision about ownership is
-- made here, under row locks, with the server's clock (ratchet_now()):
-- * a lease-holder's append takes FOR SHARE on its run_locks row after matching
--   (worker_id, epoch, unexpired); a steal, reclaim or fence updates that row, so it waits
--   for in-flight appends and they, re-checking after it, find the epoch moved and stop;
-- * writers that change a run's status without the lease (signal, cancel, retry) and the
--   holder's park/finish lock the runs row FOR UPDATE first, so a wake-up can never slip
--   between a check and a park; a transaction that locks both rows of a run always takes
--   the runs row before the run_locks row, and a run's end locks its parent's runs row
--   before its own (the parent parks under its own row lock), so none deadlock;
-- * claims and steals skip rows another transaction holds (SKIP LOCKED), so concurrent
--   workers never wait on each other or take the same run.
-- Lists are passed as arrays.
--
-- Payloads, inputs, outputs and responses are jsonb and times timestamptz (migration 005),
-- for operators reading with psql; Ratchet's connections read them as JSON text and Unix
-- seconds (store/postgres.py). JSON is sent as canonical text and cast (::jsonb), times
-- from Python go through to_timestamp(), durations through make_interval(secs => ...).

-- name: now
SELECT ratchet_now() AS now

-- name: run_insert
-- A child run belongs to its parent's tenant, whatever the caller passed.
INSERT INTO runs (run_id, workflow, workflow_version, input, status, parent_run_id,
                  parent_step_id, queue, priority, created_at, updated_at, tenant_id, tags,
                  concurrency_key)
VALUES (%(run_id)s, %(workflow)s, %(workflow_version)s, %(input)s::jsonb, 'queued',
        %(parent_run_id)s, %(parent_step_id)s, %(queue)s, %(priority)s, ratchet_now(),
        ratchet_now(), COALESCE((SELECT tenant_id FROM runs WHERE run_id = %(parent_run_id)s),
                                %(tenant_id)s), %(tags)s::jsonb, %(concurrency_key)s)
ON CONFLICT (run_id) DO NOTHING

-- name: run_get
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs WHERE run_id = %(run_id)s

-- name: run_get_locked
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key, cancel_requested, cancel_by
FROM runs WHERE run_id = %(run_id)s
FOR UPDATE

-- name: runs_get_many
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs WHERE run_id IN (SELECT unnest(%(ids)s::text[]))

-- name: runs_list
-- Newest first along runs_created; runs_list_status along runs_status.
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs ORDER BY created_at DESC, run_id LIMIT %(limit)s

-- name: runs_list_status
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs WHERE status = %(status)s
ORDER BY created_at DESC, run_id LIMIT %(limit)s

-- name: runs_filter
-- runs_list with filters, each applied when given (NULL: any).
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
ORDER BY created_at DESC, run_id LIMIT %(limit)s

-- name: runs_count_filter
SELECT count(*) FROM runs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)

-- name: runs_filter_tagged
-- Runs with every tag of %(tags)s (a JSON object), newest first: tags @> is matched along
-- runs_tags (GIN), never left to a catch-all OR a generic plan could not use the index
-- for. The other filters apply when given (NULL: any), as in runs_page.
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs
WHERE tags @> %(tags)s::jsonb
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
ORDER BY created_at DESC, run_id LIMIT %(limit)s

-- name: runs_count_tagged
SELECT count(*) FROM runs
WHERE tags @> %(tags)s::jsonb
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)

-- name: runs_finished
SELECT run_id FROM runs
WHERE run_id IN (SELECT unnest(%(ids)s::text[])) AND status IN ('succeeded', 'failed', 'cancelled')

-- name: llm_calls_of_runs
-- The LLM usage and cost journaled in some runs (a model call's step_completed; the calls
-- made inside a step, with its end, retry included): run totals for a list of runs.
SELECT run_id, (payload->'llm')::text AS llm FROM journal_events
WHERE run_id = ANY(%(ids)s::text[])
  AND kind IN ('step_completed', 'step_failed', 'step_retrying') AND payload ? 'llm'

-- name: events_load
-- payload_text: the text an event written before migration 005 was hashed with, kept where
-- jsonb may not give it back as it was (payload_exact: the text is the hashed one). A replay
-- reads thousands of events: their times come as seconds from the server (extract), which
-- costs less than loading timestamptz.
SELECT run_id, seq, kind, step_id, attempt, coalesce(payload_text, payload::text) AS payload,
       payload_text IS NOT NULL AS payload_exact, extract(epoch FROM at)::float8 AS at,
       prev_hash, hash
FROM journal_events WHERE run_id = %(run_id)s AND seq > %(after)s ORDER BY seq LIMIT %(limit)s

-- name: requests_load
-- The model requests a run journaled (step_started's request) and the drifts a replay found,
-- in seq order: read once by a drive that makes a model call, to journal its own after them.
SELECT kind, step_id,
       (CASE WHEN kind = 'step_started' THEN payload->'request' ELSE payload END)::text AS data
FROM journal_events
WHERE run_id = %(run_id)s
  AND ((kind = 'step_started' AND payload->'request' IS NOT NULL) OR kind = 'request_drifted')
ORDER BY seq

-- name: event_last
SELECT seq, hash FROM journal_events WHERE run_id = %(run_id)s ORDER BY seq DESC LIMIT 1

-- name: event_insert
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
VALUES (%(run_id)s, %(seq)s, %(kind)s, %(step_id)s, %(attempt)s, %(payload)s::jsonb,
        to_timestamp(%(at)s), %(prev_hash)s, %(hash)s)

-- name: event_insert_leased
-- Inserted only if the lease is live and this holder's (share-locking the lease row, so a
-- steal waits for this commit); fewer rows than events means the lease was lost.
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
SELECT %(run_id)s, %(seq)s, %(kind)s, %(step_id)s, %(attempt)s, %(payload)s::jsonb,
       to_timestamp(%(at)s), %(prev_hash)s, %(hash)s
WHERE EXISTS (
    SELECT 1 FROM run_locks
    WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s AND epoch = %(epoch)s
      AND expires_at > ratchet_now()
    FOR SHARE
)

-- name: lease_check
SELECT 1 FROM run_locks
WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s AND epoch = %(epoch)s
  AND expires_at > ratchet_now()
FOR SHARE

-- name: lease_row_locked
SELECT worker_id, epoch, expires_at > ratchet_now() AS live FROM run_locks WHERE run_id = %(run_id)s
FOR UPDATE

-- name: lease_get
SELECT worker_id, epoch, expires_at > ratchet_now() AS live FROM run_locks WHERE run_id = %(run_id)s

-- name: lease_retake
-- The holder drives its run again (its last drive was abandoned on a storage error): the
-- same worker, a new epoch, so whatever the abandoned drive still had in flight is fenced.
UPDATE run_locks SET epoch = epoch + 1, expires_at = ratchet_now() + make_interval(secs => %(ttl)s)
WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s AND epoch = %(epoch)s
RETURNING epoch

-- name: lease_release
UPDATE run_locks SET worker_id = NULL, expires_at = to_timestamp(0)
WHERE run_id = %(run_id)s AND worker_id = %(worker_id)s AND epoch = %(epoch)s

-- name: timers_due
-- Runs whose timer is due become queued, oldest timer first, along runs_timers (claims then
-- read only runs_queued, whatever the number of runs waiting on future timers), waking
-- every worker: this one may not serve them.
-- (SELECT ratchet_now()) is read once, so it bounds the index scan; ratchet_now() alone is
-- volatile and would be a filter on every waiting run.
WITH due AS (
    SELECT run_id FROM runs
    WHERE status = 'waiting' AND not_before <= (SELECT ratchet_now())
    ORDER BY not_before LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE runs r SET status = 'queued', waiting_for = NULL, not_before = NULL,
                      updated_at = ratchet_now()
    FROM due WHERE r.run_id = due.run_id
    RETURNING r.run_id
), woken AS (
    SELECT pg_notify('ratchet_ready', '') FROM (SELECT 1 FROM promoted LIMIT 1) AS one
)
SELECT run_id, (SELECT count(*) FROM woken) AS woken FROM promoted

-- name: dedup_holder
-- The run holding a dedup id: of this tenant and workflow, not terminal (along runs_dedup).
SELECT run_id FROM runs
WHERE tenant_id = %(tenant_id)s AND workflow = %(workflow)s AND dedup_id = %(dedup_id)s
  AND status NOT IN ('succeeded', 'failed', 'cancelled')

-- name: dedup_holder_of
-- Another run, not terminal, holding the dedup id of run_id (which a retry or a resume
-- would make not terminal again).
SELECT h.run_id FROM runs r
JOIN runs h ON h.tenant_id = r.tenant_id AND h.workflow = r.workflow AND h.dedup_id = r.dedup_id
WHERE r.run_id = %(run_id)s AND r.dedup_id IS NOT NULL AND h.run_id <> r.run_id
  AND h.status NOT IN ('succeeded', 'failed', 'cancelled')

-- name: debounce_pending
-- The run collecting a debounce key's starts, not begun yet (along runs_debounce), locked:
-- the timer making it queued and another start pushing it take turns.
SELECT run_id FROM runs
WHERE tenant_id = %(tenant_id)s AND workflow = %(workflow)s
  AND debounce_key = %(debounce_key)s AND status = 'waiting' AND waiting_for IS NULL
FOR UPDATE

-- name: debounce_push
-- A start within the window: the latest input, and the window begins again.
UPDATE runs SET input = %(input)s::jsonb, not_before = to_timestamp(%(not_before)s),
                updated_at = ratchet_now()
WHERE run_id = %(run_id)s AND status = 'waiting' AND waiting_for IS NULL

-- name: run_start_options
-- A run just inserted takes its dedup id and debounce key, and, when it may not begin
-- before a time, waits for it on no wait key until the timers make it queued.
UPDATE runs SET dedup_id = %(dedup_id)s, debounce_key = %(debounce_key)s,
                status = CASE WHEN %(not_before)s::float8 IS NULL THEN status ELSE 'waiting' END,
                not_before = to_timestamp(%(not_before)s::float8)
WHERE run_id = %(run_id)s AND status = 'queued'

-- name: claim_pick
-- One queue's ready runs of the workflows the worker serves, in runs_queued order.
SELECT run_id, priority, created_at FROM runs
WHERE status = 'queued' AND queue = %(queue)s
  AND (workflow, workflow_version) IN (
      SELECT * FROM unnest(%(served_workflows)s::text[], %(served_versions)s::text[]))
ORDER BY priority DESC, created_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: steal_pick
SELECT r.run_id FROM runs r LEFT JOIN run_locks l ON l.run_id = r.run_id
WHERE r.status = 'running' AND r.queue IN (SELECT unnest(%(queues)s::text[]))
  AND (l.run_id IS NULL OR l.expires_at <= ratchet_now())
  AND (r.workflow, r.workflow_version) IN (
      SELECT * FROM unnest(%(served_workflows)s::text[], %(served_versions)s::text[]))
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED

-- name: reclaim_pick
SELECT l.run_id FROM run_locks l JOIN runs r ON r.run_id = l.run_id
WHERE l.worker_id = %(worker_id)s AND r.status = 'running'
  AND (r.workflow, r.workflow_version) IN (
      SELECT * FROM unnest(%(served_workflows)s::text[], %(served_versions)s::text[]))
FOR UPDATE OF l

-- name: runs_set_running
UPDATE runs SET status = 'running', waiting_for = NULL, not_before = NULL,
                updated_at = ratchet_now()
WHERE run_id IN (SELECT unnest(%(ids)s::text[]))

-- name: leases_take
-- A new lease row continues above the highest epoch the run ever handed out.
INSERT INTO run_locks (run_id, worker_id, epoch, expires_at)
SELECT run_id, %(worker_id)s, lease_epoch + 1, ratchet_now() + make_interval(secs => %(ttl)s)
FROM runs WHERE run_id = ANY(%(ids)s::text[])
ON CONFLICT (run_id) DO UPDATE
SET worker_id = excluded.worker_id, epoch = run_locks.epoch + 1, expires_at = excluded.expires_at
-- Judged on the lease as committed now, not as the pick saw it: of two sweepers that
-- picked the same expired lease, the second finds it live and takes nothing.
WHERE run_locks.expires_at <= ratchet_now() OR run_locks.worker_id = excluded.worker_id
RETURNING run_id, epoch

-- name: leases_renew
UPDATE run_locks SET expires_at = ratchet_now() + make_interval(secs => %(ttl)s)
WHERE worker_id = %(worker_id)s AND run_id = ANY(%(ids)s::text[])

-- name: leases_held
-- With who asked for a pending cancel: the renewal that finds it tells the drive.
SELECT l.run_id, l.epoch, r.cancel_requested, r.cancel_by
FROM run_locks l JOIN runs r ON r.run_id = l.run_id
WHERE l.worker_id = %(worker_id)s AND l.run_id = ANY(%(ids)s::text[])

-- name: runs_requeue_worker
UPDATE runs SET status = 'queued', updated_at = ratchet_now()
WHERE status = 'running'
  AND run_id IN (SELECT run_id FROM run_locks WHERE worker_id = %(worker_id)s)

-- name: leases_release_worker
UPDATE run_locks SET worker_id = NULL, expires_at = to_timestamp(0)
WHERE worker_id = %(worker_id)s

-- name: run_park
UPDATE runs SET status = 'waiting', waiting_for = %(waiting_for)s,
                not_before = to_timestamp(%(not_before)s), updated_at = ratchet_now()
WHERE run_id = %(run_id)s AND status = 'running'

-- name: run_wake
-- A run parked on several waits at once (any:[...]) wakes for whichever comes first.
UPDATE runs SET status = 'queued', waiting_for = NULL, not_before = NULL,
                updated_at = ratchet_now()
WHERE run_id = %(run_id)s AND status = 'waiting'
  AND (waiting_for = %(waiting_for)s OR waiting_for LIKE 'any:%%')

-- name: run_requeue
UPDATE runs SET status = 'queued', output = NULL, error = NULL, waiting_for = NULL,
                not_before = NULL, cancel_requested = false, cancel_by = NULL,
                updated_at = ratchet_now()
WHERE run_id = %(run_id)s AND status = 'failed'

-- name: run_resume
-- A cancelled run queued again (ratchet.store.forks.resume): the same row, from where its
-- journal left off.
UPDATE runs SET status = 'queued', output = NULL, error = NULL, waiting_for = NULL,
                not_before = NULL, cancel_requested = false, cancel_by = NULL,
                updated_at = ratchet_now()
WHERE run_id = %(run_id)s AND status = 'cancelled'

-- name: fork_insert
-- A fork (ratchet.store.forks): a new top-level run with its lineage.
INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, priority,
                  created_at, updated_at, tenant_id, tags, forked_from, forked_at, concurrency_key)
VALUES (%(run_id)s, %(workflow)s, %(workflow_version)s, %(input)s::jsonb, 'queued',
        %(queue)s, %(priority)s, ratchet_now(), ratchet_now(), %(tenant_id)s,
        %(tags)s::jsonb, %(forked_from)s, %(forked_at)s, %(concurrency_key)s)

-- name: run_finish
-- Keeps the lease's epoch (the row goes with lease_drop in the same transaction).
UPDATE runs SET status = %(status)s, output = %(output)s::jsonb, error = %(error)s,
                waiting_for = NULL,
                not_before = NULL, cancel_requested = false, cancel_by = NULL,
                updated_at = ratchet_now(),
                lease_epoch = coalesce(
                    (SELECT epoch FROM run_locks WHERE run_id = %(run_id)s), lease_epoch)
WHERE run_id = %(run_id)s AND status NOT IN ('succeeded', 'failed', 'cancelled')

-- name: lease_drop
DELETE FROM run_locks WHERE run_id = %(run_id)s

-- name: signals_drop_consumed
DELETE FROM signals WHERE run_id = %(run_id)s AND consumed_seq IS NOT NULL

-- name: run_cancel_request
-- The first name given stays: who asked first cancelled it.
UPDATE runs SET cancel_requested = true, cancel_by = COALESCE(cancel_by, %(by)s),
                updated_at = ratchet_now()
WHERE run_id = %(run_id)s

-- name: signal_insert
INSERT INTO signals (run_id, name, payload, sent_at)
VALUES (%(run_id)s, %(name)s, %(payload)s::jsonb, ratchet_now())

-- name: signal_pending
SELECT id, payload FROM signals
WHERE run_id = %(run_id)s AND name = %(name)s AND consumed_seq IS NULL ORDER BY id LIMIT 1

-- name: signal_consume
UPDATE signals SET consumed_seq = %(seq)s
WHERE run_id = %(run_id)s AND id = %(id)s AND consumed_seq IS NULL

-- name: dead_letter_put
INSERT INTO dead_letters (run_id, reason, error, at) VALUES (%(run_id)s, %(reason)s, %(error)s, ratchet_now())
ON CONFLICT (run_id) DO UPDATE SET reason = excluded.reason, error = excluded.error, at = excluded.at

-- name: dead_letter_delete
DELETE FROM dead_letters WHERE run_id = %(run_id)s

-- name: dead_letters_list
SELECT d.run_id, r.workflow, d.reason, d.error, d.at
FROM dead_letters d JOIN runs r ON r.run_id = d.run_id ORDER BY d.at DESC LIMIT %(limit)s

-- name: runs_count
-- Listings say how many there are when they show fewer (``ratchet runs``, ``ratchet dlq``).
SELECT count(*) FROM runs

-- name: runs_count_by_status
SELECT count(*) FROM runs WHERE status = %(status)s

-- name: dead_letters_count
SELECT count(*) FROM dead_letters

-- A receipt's identity is (run_id, step_id, delivery); its key is the one sent out, derived
-- from the attempt that first claimed it. A claim that conflicts with either (a later
-- attempt of the same delivery, or a re-drive of the attempt that claimed it) inserts
-- nothing, and the claimer reads the receipt back.

-- name: receipt_get
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts WHERE idempotency_key = %(key)s

-- name: receipt_get_locked
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts WHERE idempotency_key = %(key)s
FOR UPDATE

-- name: receipt_find
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND delivery = %(delivery)s

-- name: receipt_claim
INSERT INTO side_effect_receipts (idempotency_key, run_id, step_id, delivery, attempt, status,
                                  epoch, claimed_at)
VALUES (%(key)s, %(run_id)s, %(step_id)s, %(delivery)s, %(attempt)s, 'claimed',
        %(epoch)s, ratchet_now())
ON CONFLICT DO NOTHING

-- name: receipt_reclaim
UPDATE side_effect_receipts SET epoch = %(epoch)s, claimed_at = ratchet_now()
WHERE idempotency_key = %(key)s AND status = 'claimed'

-- name: receipt_settle
UPDATE side_effect_receipts SET status = 'settled', response = %(response)s::jsonb,
                                epoch = %(epoch)s,
                                settled_by = 'worker', settled_at = ratchet_now()
WHERE idempotency_key = %(key)s AND status = 'claimed'

-- name: receipt_resolve
-- By hand: no lease and no epoch of its own (the caller checked the run is not being driven).
UPDATE side_effect_receipts SET status = %(status)s, response = %(response)s::jsonb,
                                settled_by = 'hand', settled_at = ratchet_now()
WHERE idempotency_key = %(key)s AND status = 'claimed'

-- name: receipts_list
SELECT idempotency_key, run_id, step_id, status, response, claimed_at, settled_at,
       delivery, attempt, settled_by
FROM side_effect_receipts WHERE run_id = %(run_id)s ORDER BY claimed_at, step_id, delivery

-- name: worker_upsert
INSERT INTO workers (worker_id, host, pid, started_at, seen_at, serves, queues, lease_ttl,
                     liveness_lock)
VALUES (%(worker_id)s, %(host)s, %(pid)s, ratchet_now(), ratchet_now(), %(serves)s,
        %(queues)s, %(lease_ttl)s, %(liveness_lock)s)
ON CONFLICT (worker_id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
    seen_at = excluded.seen_at, serves = excluded.serves, queues = excluded.queues,
    lease_ttl = excluded.lease_ttl, liveness_lock = excluded.liveness_lock

-- name: worker_get
SELECT host, pid FROM workers WHERE worker_id = %(worker_id)s

-- name: worker_lock
-- A worker's liveness lock (migration 019): a session-level advisory lock on a connection
-- of its own, held while the worker runs and released by the server when the session ends
-- (the process died, its socket closed). The key is a 64-bit hash of the worker id and of
-- this schema's workers table: advisory locks are per database, and installations in other
-- schemas of it have workers of their own.
SELECT pg_try_advisory_lock(
    hashtextextended('workers'::regclass::oid::text || ':' || %(worker_id)s, 0)) AS held

-- name: worker_unlock
SELECT pg_advisory_unlock(
    hashtextextended('workers'::regclass::oid::text || ':' || %(worker_id)s, 0)) AS held

-- name: workers_dead
-- The workers that took a liveness lock and whose session no longer holds it: a shared try
-- succeeds only while no session holds the key. The shared lock is kept to the end of the
-- transaction, so the worker id cannot start again before this one has taken its runs.
-- Never in the first seconds of the server's life: a restart ended every session, and the
-- live workers are taking their locks again on new ones.
WITH locking AS MATERIALIZED (
    SELECT worker_id FROM workers WHERE liveness_lock AND worker_id <> %(worker_id)s
      AND pg_postmaster_start_time() < clock_timestamp() - make_interval(secs => %(settle)s))
SELECT worker_id FROM locking
WHERE pg_try_advisory_xact_lock_shared(
    hashtextextended('workers'::regclass::oid::text || ':' || worker_id, 0))

-- name: takeover_pick
SELECT r.run_id FROM run_locks l JOIN runs r ON r.run_id = l.run_id
WHERE l.worker_id = ANY(%(dead)s::text[]) AND r.status = 'running'
  AND r.queue IN (SELECT unnest(%(queues)s::text[]))
  AND (r.workflow, r.workflow_version) IN (
      SELECT * FROM unnest(%(served_workflows)s::text[], %(served_versions)s::text[]))
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED

-- name: leases_take_over
-- The dead holder's lease, live or not, one epoch up: whatever it might still write is
-- fenced off.
UPDATE run_locks
SET worker_id = %(worker_id)s, epoch = epoch + 1,
    expires_at = ratchet_now() + make_interval(secs => %(ttl)s)
WHERE run_id = ANY(%(ids)s::text[]) AND worker_id = ANY(%(dead)s::text[])
RETURNING run_id, epoch

-- name: workers_forget
-- Dead workers left with no lease: their rows go (a restart writes its own again).
DELETE FROM workers w
WHERE w.worker_id = ANY(%(dead)s::text[])
  AND NOT EXISTS (SELECT 1 FROM run_locks l WHERE l.worker_id = w.worker_id)

-- name: worker_seen
UPDATE workers SET seen_at = ratchet_now() WHERE worker_id = %(worker_id)s

-- name: worker_delete
DELETE FROM workers WHERE worker_id = %(worker_id)s

-- name: workers_prune
-- Workers not seen for many of their own TTLs are gone (a live one renews every ttl/3).
DELETE FROM workers WHERE seen_at + make_interval(secs => lease_ttl * %(ttls)s) < ratchet_now()

-- name: workers_live
SELECT worker_id, host, pid, serves, queues, lease_ttl, seen_at FROM workers
WHERE seen_at + make_interval(secs => lease_ttl) > ratchet_now() ORDER BY worker_id

-- name: notify
SELECT pg_notify(%(channel)s, %(key)s)

-- name: migrations_lock
SELECT pg_advisory_xact_lock(7261001)

-- name: migrations_applied
-- The migrations applied in the schema the store works in (the first of its search_path,
-- where migrating would create the tables), or no row when it has none: a store starting
-- against a database that has every migration it knows skips the migrator's lock.
SELECT version FROM schema_migrations
WHERE to_regclass(format('%I.schema_migrations', current_schema())) IS NOT NULL

-- name: append_events
-- The per-step hot path, with group commit: the step boundaries of many runs in one
-- statement outside an explicit transaction (one round trip, one commit). The events come
-- as one JSON array of rows [run_id, worker_id, epoch, seq, kind, step_id, attempt,
-- payload, at, prev_hash, hash]: one text parameter, which the client encodes far more
-- cheaply than eleven typed arrays. A run's events are inserted only if its lease is live
-- and held by the (worker_id, epoch) they carry; the lease rows are share-locked in run_id
-- order (as renewals update them) so a concurrent steal waits for this commit. RETURNING
-- tells which runs' events landed.
WITH e AS (
    SELECT r->>0 AS run_id, r->>1 AS worker_id, (r->>2)::bigint AS epoch,
           (r->>3)::bigint AS seq, r->>4 AS kind, r->>5 AS step_id,
           (r->>6)::integer AS attempt, r->>7 AS payload, (r->>8)::float8 AS at,
           r->>9 AS prev_hash, r->>10 AS hash
    FROM jsonb_array_elements(%(events)s::jsonb) AS r
), held AS (
    SELECT l.run_id FROM run_locks l
    WHERE l.run_id = ANY(ARRAY(SELECT DISTINCT run_id FROM e))
      AND l.expires_at > ratchet_now()
      AND EXISTS (SELECT 1 FROM e WHERE e.run_id = l.run_id AND e.worker_id = l.worker_id
                                      AND e.epoch = l.epoch)
    ORDER BY l.run_id
    FOR SHARE OF l
)
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
SELECT e.run_id, e.seq, e.kind, e.step_id, e.attempt, e.payload::jsonb, to_timestamp(e.at),
       e.prev_hash, e.hash
FROM e JOIN held ON held.run_id = e.run_id
RETURNING run_id

-- name: claim_ready
-- A claim in one statement (one round trip): pick ready runs no one else is taking, lease
-- them with the epoch bumped, mark them running, and return them with their epoch.
-- Each queue is read along runs_queued (priority, then age) and stops at the limit, so
-- the cost does not grow with the backlog; the queues' heads are then merged. Runs whose
-- (workflow, version) this worker does not serve are left for a worker that does.
-- Queues with limits are left to the claim of ratchet.store.queues (a look at the small
-- queues table by name, the only cost of limits to the queues without them).
WITH picked AS (
    SELECT c.run_id, c.lease_epoch
    FROM (SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name)
          WHERE NOT EXISTS (
              SELECT 1 FROM queues l WHERE l.name = u.name
                AND (l.concurrency IS NOT NULL OR l.per_key_concurrency IS NOT NULL
                     OR l.rate_limit IS NOT NULL))) AS q
    CROSS JOIN LATERAL (
        SELECT run_id, priority, created_at, lease_epoch FROM runs
        WHERE status = 'queued' AND queue = q.name
          AND (workflow, workflow_version) IN (
              SELECT * FROM unnest(%(served_workflows)s::text[], %(served_versions)s::text[]))
        ORDER BY priority DESC, created_at LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
    ORDER BY c.priority DESC, c.created_at LIMIT %(limit)s
), leased AS (
    INSERT INTO run_locks (run_id, worker_id, epoch, expires_at)
    SELECT run_id, %(worker_id)s, lease_epoch + 1, ratchet_now() + make_interval(secs => %(ttl)s)
    FROM picked
    ON CONFLICT (run_id) DO UPDATE
    SET worker_id = excluded.worker_id, epoch = run_locks.epoch + 1,
        expires_at = excluded.expires_at
    RETURNING run_id, epoch
)
UPDATE runs r SET status = 'running', waiting_for = NULL, not_before = NULL,
                  updated_at = ratchet_now()
FROM leased WHERE r.run_id = leased.run_id
RETURNING r.run_id, r.workflow, r.workflow_version, r.input, r.status, r.output, r.error,
          r.parent_run_id, r.parent_step_id, r.queue, r.priority, r.not_before, r.waiting_for,
          r.created_at, r.updated_at, r.tenant_id, r.tags, r.forked_from, r.forked_at, r.concurrency_key, leased.epoch

-- name: create_run
-- Start in one statement: the run (queued), its run_queued event and the wake-up, or, when
-- the run id exists already, that run as it is (created = false). Rows a statement inserts
-- are invisible to its own reads, so the new row comes back from RETURNING.
WITH new AS (
    INSERT INTO runs (run_id, workflow, workflow_version, input, status, parent_run_id,
                      parent_step_id, queue, priority, created_at, updated_at, tenant_id, tags,
                      concurrency_key)
    VALUES (%(run_id)s, %(workflow)s, %(workflow_version)s, %(input)s::jsonb, 'queued',
            %(parent_run_id)s, %(parent_step_id)s, %(queue)s, %(priority)s, ratchet_now(),
            ratchet_now(),
            COALESCE((SELECT tenant_id FROM runs WHERE run_id = %(parent_run_id)s),
                     %(tenant_id)s), %(tags)s::jsonb, %(concurrency_key)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, workflow, workflow_version, input, status, output, error,
              parent_run_id, parent_step_id, queue, priority, not_before, waiting_for,
              created_at, updated_at, tenant_id, tags, forked_from, forked_at, concurrency_key
), queued AS (
    INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash,
                                hash)
    SELECT run_id, 1, 'run_queued', NULL, NULL, %(payload)s::jsonb, to_timestamp(%(at)s),
           %(prev_hash)s, %(hash)s
    FROM new
    RETURNING run_id
), woken AS (
    SELECT pg_notify('ratchet_ready', '') FROM queued
)
SELECT new.*, true AS created, (SELECT count(*) FROM woken) AS woken FROM new
UNION ALL
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key, false AS created, 0 AS woken
FROM runs WHERE run_id = %(run_id)s AND NOT EXISTS (SELECT 1 FROM new)

-- name: create_runs
-- A batch start in one statement: the runs (queued) whose ids do not exist yet, and the
-- run_queued event of each one inserted (a row of the arrays per run, in the same order).
-- RETURNING names the runs inserted; an id skipped was there already (the caller reads it).
-- Inserted in run id order, so two batches sharing ids wait for each other in one order
-- rather than deadlock.
WITH r AS (
    SELECT * FROM unnest(%(run_ids)s::text[], %(workflows)s::text[], %(versions)s::text[],
                         %(inputs)s::text[], %(queues)s::text[], %(priorities)s::integer[],
                         %(tenants)s::text[], %(payloads)s::text[], %(ats)s::float8[],
                         %(hashes)s::text[], %(tags)s::text[], %(keys)s::text[])
         AS r(run_id, workflow, workflow_version, input, queue, priority, tenant_id, payload,
              at, hash, tags, concurrency_key)
), new AS (
    INSERT INTO runs (run_id, workflow, workflow_version, input, status, queue, priority,
                      created_at, updated_at, tenant_id, tags, concurrency_key)
    SELECT run_id, workflow, workflow_version, input::jsonb, 'queued', queue, priority,
           ratchet_now(), ratchet_now(), tenant_id, tags::jsonb, concurrency_key
    FROM r ORDER BY run_id
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
)
INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, at, prev_hash, hash)
SELECT r.run_id, 1, 'run_queued', NULL, NULL, r.payload::jsonb, to_timestamp(r.at),
       %(genesis)s, r.hash
FROM r JOIN new ON new.run_id = r.run_id
RETURNING run_id

-- name: run_hand_back
UPDATE runs SET status = 'queued', updated_at = ratchet_now()
WHERE run_id = %(run_id)s AND status = 'running'

-- name: runs_children_active
SELECT run_id FROM runs
WHERE parent_run_id = %(run_id)s AND status NOT IN ('succeeded', 'failed', 'cancelled')
ORDER BY run_id

-- Approvals (migration 006): a row per approval step, written with the step_waiting that
-- asks, decided at most once (every decision is an update guarded by status = 'pending';
-- deciders lock the run's row first, so two of them take turns).

-- name: approval_ask
-- A new ask, or the same step asked again by a later attempt (a retry of the run after its
-- approval timed out): the row starts over. A re-drive asking the same attempt keeps it.
INSERT INTO approvals (run_id, step_id, attempt, name, data, root_run_id, asked_at, deadline)
VALUES (%(run_id)s, %(step_id)s, %(attempt)s, %(name)s, %(data)s::jsonb, %(root_run_id)s,
        ratchet_now(), to_timestamp(%(deadline)s))
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
WHERE a.run_id = %(run_id)s AND a.step_id = %(step_id)s

-- name: approvals_named
SELECT a.run_id, a.step_id, a.attempt, a.name, a.data, a.root_run_id, a.asked_at,
       a.deadline, a.status, a.decided_by, a.comment, a.decided_at, a.note, a.granted,
       r.parent_run_id
FROM approvals a JOIN runs r ON r.run_id = a.run_id
WHERE a.run_id = %(run_id)s AND a.name = %(name)s ORDER BY a.asked_at, a.step_id

-- name: approval_decide
-- grant is what approving a guard's pause lets the run go over to (migration 017).
UPDATE approvals SET status = %(status)s, decided_by = %(by)s, comment = %(comment)s,
                     note = %(note)s,
                     decided_at = ratchet_now(), granted = %(grant)s::jsonb
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND attempt = %(attempt)s
  AND status = 'pending'

-- name: approval_expire
UPDATE approvals SET status = 'expired', decided_at = ratchet_now()
WHERE run_id = %(run_id)s AND step_id = %(step_id)s AND attempt = %(attempt)s
  AND status = 'pending'

-- name: approvals_pending
-- Pending approvals of unfinished runs, oldest first; with run_id, only that run's and
-- those of the runs under it (its children, theirs, ...).
SELECT a.run_id, a.step_id, a.attempt, a.name, a.data, a.root_run_id, a.asked_at,
       a.deadline, a.status, a.decided_by, a.comment, a.decided_at, a.note, a.granted,
       r.parent_run_id
FROM approvals a JOIN runs r ON r.run_id = a.run_id
WHERE a.status = 'pending' AND r.status NOT IN ('succeeded', 'failed', 'cancelled')
  AND (%(run_id)s::text IS NULL OR a.run_id = %(run_id)s OR a.root_run_id = %(run_id)s
       OR substr(a.run_id, 1, length(%(run_id)s) + 1) = %(run_id)s || '/')
ORDER BY a.asked_at, a.run_id, a.step_id LIMIT %(limit)s

-- Graphs (migration 007): registered graph versions, keyed by content hash. Registering
-- a version again keeps its first registration time.
-- name: graph_insert
INSERT INTO graphs (name, version, definition, registered_at)
VALUES (%(name)s, %(version)s, %(definition)s::jsonb, ratchet_now())
ON CONFLICT (name, version) DO NOTHING

-- name: graph_get
SELECT name, version, definition, registered_at FROM graphs
WHERE name = %(name)s AND version = %(version)s

-- name: graph_latest
SELECT name, version, definition, registered_at FROM graphs WHERE name = %(name)s
ORDER BY registered_at DESC, version LIMIT 1

-- name: graphs_list
-- Every version of every graph, newest first within a name.
SELECT name, version, definition, registered_at FROM graphs
ORDER BY name, registered_at DESC, version

-- name: events_heads
-- The last seq of each of some runs (SQLite's shared poll; here for parity and tools).
SELECT run_id, MAX(seq) AS seq FROM journal_events
WHERE run_id = ANY(%(ids)s::text[]) GROUP BY run_id

-- name: token_insert
-- expires_in: seconds from now on the database's clock (NULL: never expires).
INSERT INTO api_tokens (token_id, token_hash, tenant_id, scopes, name, created_at,
                        expires_at)
VALUES (%(token_id)s, %(token_hash)s, %(tenant_id)s, %(scopes)s, %(name)s, ratchet_now(),
        CASE WHEN %(expires_in)s::float8 IS NULL THEN NULL
             ELSE ratchet_now() + make_interval(secs => %(expires_in)s::float8) END)

-- name: token_by_hash
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
  AND (expires_at IS NULL OR expires_at > ratchet_now())

-- name: tokens_list
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens
ORDER BY created_at, token_id

-- name: token_revoke
UPDATE api_tokens SET revoked_at = ratchet_now()
WHERE token_id = %(token_id)s AND revoked_at IS NULL

-- name: token_get
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens
WHERE token_id = %(token_id)s

-- name: tokens_of_tenant
SELECT token_id, tenant_id, scopes, name, created_at, revoked_at, expires_at
FROM api_tokens WHERE tenant_id = %(tenant_id)s
ORDER BY created_at, token_id

-- name: tokens_ended
-- Of the tokens that open event streams stand for: whether each is revoked or expired by
-- now, and when it expires (the streams' watch sleeps until the next expiry at most).
SELECT token_id, (revoked_at IS NOT NULL OR expires_at <= ratchet_now()) AS ended, expires_at
FROM api_tokens WHERE token_id IN (SELECT unnest(%(ids)s::text[]))

-- Tenant-scoped run ids (migration 016; ratchet.store.tenants) ---------------------------

-- name: tenant_legacy_ids
SELECT tenant_id FROM tenant_legacy_ids

-- name: run_owners
SELECT run_id, tenant_id FROM runs WHERE run_id IN (SELECT unnest(%(ids)s::text[]))

-- name: runs_page
-- A tenant's runs, newest first, after a (created_at, run_id) cursor; each filter applies
-- when given (NULL: any); text: a substring of the run id (strpos: no wildcards). Times travel as epoch seconds; microseconds survive the float.
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs
WHERE tenant_id = %(tenant_id)s
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(parent)s::text IS NULL OR parent_run_id = %(parent)s::text)
  AND (%(text)s::text IS NULL OR strpos(run_id, %(text)s::text) > 0)
  AND (%(created_after)s::float8 IS NULL
       OR created_at >= to_timestamp(%(created_after)s::float8))
  AND (%(created_before)s::float8 IS NULL
       OR created_at < to_timestamp(%(created_before)s::float8))
  AND (%(cursor_at)s::float8 IS NULL OR created_at < to_timestamp(%(cursor_at)s::float8)
       OR (created_at = to_timestamp(%(cursor_at)s::float8) AND run_id > %(cursor_id)s::text))
ORDER BY created_at DESC, run_id LIMIT %(limit)s

-- name: runs_page_tagged
-- runs_page of the runs with every tag of %(tags)s, matched as in runs_filter_tagged.
SELECT run_id, workflow, workflow_version, input, status, output, error, parent_run_id,
       parent_step_id, queue, priority, not_before, waiting_for, created_at, updated_at, tenant_id,
       tags, forked_from, forked_at, concurrency_key
FROM runs
WHERE tenant_id = %(tenant_id)s
  AND tags @> %(tags)s::jsonb
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(parent)s::text IS NULL OR parent_run_id = %(parent)s::text)
  AND (%(text)s::text IS NULL OR strpos(run_id, %(text)s::text) > 0)
  AND (%(created_after)s::float8 IS NULL
       OR created_at >= to_timestamp(%(created_after)s::float8))
  AND (%(created_before)s::float8 IS NULL
       OR created_at < to_timestamp(%(created_before)s::float8))
  AND (%(cursor_at)s::float8 IS NULL OR created_at < to_timestamp(%(cursor_at)s::float8)
       OR (created_at = to_timestamp(%(cursor_at)s::float8) AND run_id > %(cursor_id)s::text))
ORDER BY created_at DESC, run_id LIMIT %(limit)s

-- name: dead_letters_of_tenant
SELECT d.run_id, r.workflow, d.reason, d.error, d.at
FROM dead_letters d JOIN runs r ON r.run_id = d.run_id
WHERE r.tenant_id = %(tenant_id)s ORDER BY d.at DESC LIMIT %(limit)s

-- Server readiness (/readyz) ----------------------------------------------------------

-- name: migrations_applied
SELECT version FROM schema_migrations

-- Dashboard (ratchet server's pages): browser sessions and the list page's reads.

-- name: ui_session_insert
-- Expired sessions go as new ones come, so the table holds only live ones and a few more.
INSERT INTO ui_sessions (session_hash, token_id, created_at, expires_at)
VALUES (%(session_hash)s, %(token_id)s, ratchet_now(),
        ratchet_now() + make_interval(secs => %(ttl_s)s))

-- name: ui_sessions_expire
DELETE FROM ui_sessions WHERE expires_at <= ratchet_now()

-- name: ui_session_token
-- The live token behind a live session: an expired session or a revoked token is none.
SELECT t.token_id, t.tenant_id, t.scopes, t.name, t.created_at, t.revoked_at,
       t.expires_at
FROM ui_sessions s JOIN api_tokens t ON t.token_id = s.token_id
WHERE s.session_hash = %(session_hash)s AND s.expires_at > ratchet_now()
  AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > ratchet_now())

-- name: ui_session_delete
DELETE FROM ui_sessions WHERE session_hash = %(session_hash)s

-- name: ui_status_counts
SELECT status, COUNT(*) AS n FROM runs WHERE tenant_id = %(tenant_id)s GROUP BY status

-- name: ui_runs_changed
-- What the live list compares between polls: the run that changed last. A start adds a row
-- and every status change moves updated_at, so either moves this answer; read from the end
-- of runs_tenant_changed, it costs one index seek however many runs the tenant has.
SELECT run_id, updated_at AS changed FROM runs WHERE tenant_id = %(tenant_id)s
ORDER BY updated_at DESC, run_id DESC LIMIT 1

-- name: ui_step_counts
SELECT run_id, COUNT(DISTINCT step_id) AS steps FROM journal_events
WHERE run_id = ANY(%(ids)s::text[]) AND kind = 'step_started'
GROUP BY run_id

-- name: ui_timeline_events
-- A journal as the waterfall reads it: every event's time, kind and step; of a step_started
-- only the two fields the waterfall reads (its kind, a child's run id), extracted here so a
-- long journal's thousands of starts are not parsed in Python; the whole payload only of
-- the rare kinds whose payload the waterfall and the run's story read (not the outputs of
-- completed steps, most of a long journal's bytes).
SELECT seq, kind, step_id, attempt, extract(epoch FROM at)::float8 AS at,
       CASE WHEN kind IN ('step_waiting', 'run_started', 'run_resumed', 'run_queued',
                          'run_failed', 'run_cancelled', 'step_failed', 'anomaly_detected',
                          'confidence_evaluated', 'confidence_gate_bypassed')
            THEN payload::text END AS payload,
       CASE WHEN kind = 'step_started' THEN payload->>'kind' END AS step_kind,
       CASE WHEN kind = 'step_started' THEN payload->>'child_run_id' END AS child_run_id
FROM journal_events WHERE run_id = %(run_id)s AND seq <= %(upto)s ORDER BY seq

-- Guards (issue 12) -------------------------------------------------------------------------

-- name: guard_retries_recent
-- A workflow's retries within the last window_s seconds, across its runs and workers.
SELECT count(*) AS n FROM journal_events e JOIN runs r ON r.run_id = e.run_id
WHERE e.kind = 'step_retrying'
  AND e.at >= ratchet_now() - make_interval(secs => %(window_s)s::float8)
  AND r.workflow = %(workflow)s

-- name: guard_llm_history
-- The LLM calls of a workflow's last `limit` finished runs (a run without any: one row
-- whose llm is NULL), for the spike guards' medians.
SELECT r.run_id, e.step_id, (e.payload->'llm')::text AS llm
FROM (SELECT run_id FROM runs
      WHERE workflow = %(workflow)s AND status IN ('succeeded', 'failed')
      ORDER BY updated_at DESC LIMIT %(limit)s) r
LEFT JOIN journal_events e ON e.run_id = r.run_id AND e.kind = 'step_completed'
     AND e.payload ? 'llm'

-- Signed run receipts and retention (migration 010). A receipt covers the journal up to
-- its seq; a newer one (the run ended again after a retry) replaces an older one, never the
-- reverse. Pruning deletes a finished run's journal in small transactions, after checking
-- that its receipt covers the whole journal; the receipt, the runs row and its delivery
-- receipts stay. The runs rows are locked while marked, so a retry of a dead-lettered run
-- waits for the mark and then finds no dead letter.

-- name: run_receipt_put
INSERT INTO run_receipts (run_id, seq, key_id, envelope, signed_at)
VALUES (%(run_id)s, %(seq)s, %(key_id)s, %(envelope)s::jsonb, ratchet_now())
ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, key_id = excluded.key_id,
    envelope = excluded.envelope, signed_at = excluded.signed_at
WHERE run_receipts.seq < excluded.seq

-- name: run_receipt_get
SELECT run_id, seq, key_id, envelope::text AS envelope, signed_at
FROM run_receipts WHERE run_id = %(run_id)s

-- name: run_pruned_at
SELECT pruned_at FROM runs WHERE run_id = %(run_id)s

-- name: prune_candidates
-- Finished runs past the cutoff, oldest first, with the seq their receipt covers (NULL: no
-- receipt yet) and their journal's last seq.
SELECT r.run_id, k.seq AS receipt_seq,
       (SELECT max(seq) FROM journal_events j WHERE j.run_id = r.run_id) AS last_seq
FROM runs r LEFT JOIN run_receipts k ON k.run_id = r.run_id
WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.pruned_at IS NULL
  AND r.status = ANY(%(statuses)s::text[]) AND r.updated_at < to_timestamp(%(before)s)
ORDER BY r.updated_at LIMIT %(limit)s

-- name: prune_count
SELECT count(*) AS runs,
       sum((SELECT max(seq) FROM journal_events j WHERE j.run_id = r.run_id)) AS events
FROM runs r
WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.pruned_at IS NULL
  AND r.status = ANY(%(statuses)s::text[]) AND r.updated_at < to_timestamp(%(before)s)

-- name: prune_mark
-- Only a run whose receipt covers its whole journal; a run re-queued meanwhile is no longer
-- finished and is left alone.
UPDATE runs SET pruned_at = ratchet_now()
WHERE run_id = ANY(%(ids)s::text[])
  AND status IN ('succeeded', 'failed', 'cancelled') AND pruned_at IS NULL
  AND EXISTS (SELECT 1 FROM run_receipts k WHERE k.run_id = runs.run_id
              AND k.seq = (SELECT max(seq) FROM journal_events j WHERE j.run_id = runs.run_id))
RETURNING run_id

-- name: prune_dead_letters
DELETE FROM dead_letters WHERE run_id = ANY(%(ids)s::text[])

-- name: prune_in_progress
SELECT run_id FROM runs WHERE pruned_at IS NOT NULL AND NOT journal_pruned LIMIT %(limit)s

-- name: prune_events
DELETE FROM journal_events WHERE (run_id, seq) IN (
    SELECT run_id, seq FROM journal_events WHERE run_id = ANY(%(ids)s::text[])
    LIMIT %(limit)s)

-- name: prune_done
UPDATE runs SET journal_pruned = true WHERE run_id = ANY(%(ids)s::text[])

-- Sandboxes (the isolated tier, migration 011): one row per sandbox spawned for a run.
-- name: sandboxes_end_stale
-- Rows a dead owner left open: a sandbox lives only while its owner holds the lease, so
-- once another holder runs the run, no earlier sandbox of it is alive.
UPDATE sandboxes SET status = 'terminated', ended_at = ratchet_now(), end_reason = 'orphaned'
WHERE run_id = %(run_id)s AND status <> 'terminated'

-- name: sandbox_attempts
-- Sandboxes that count against the run's resume limit: those of lease epochs from :since
-- on (after a manual retry, the drives since), but for those a worker's clean shutdown
-- stopped; and the highest attempt number so far.
SELECT count(*) FILTER (WHERE coalesce(end_reason, '') <> 'shutdown'
                        AND epoch >= %(since)s) AS counted,
       coalesce(max(attempt), 0) AS last
FROM sandboxes WHERE run_id = %(run_id)s

-- name: sandbox_insert
INSERT INTO sandboxes (sandbox_id, run_id, attempt, backend, worker_id, epoch, started_at)
VALUES (%(sandbox_id)s, %(run_id)s, %(attempt)s, %(backend)s, %(worker_id)s, %(epoch)s,
        ratchet_now())

-- name: sandbox_running
UPDATE sandboxes SET status = 'running'
WHERE sandbox_id = %(sandbox_id)s AND status = 'starting'

-- name: sandbox_end
UPDATE sandboxes SET status = 'terminated', ended_at = ratchet_now(),
       exit_code = %(exit_code)s, signal = %(signal)s, peak_memory = %(peak_memory)s,
       end_reason = %(end_reason)s
WHERE sandbox_id = %(sandbox_id)s AND status <> 'terminated'

-- name: sandboxes_of_run
SELECT sandbox_id, run_id, attempt, status, backend, worker_id, epoch, started_at, ended_at,
       exit_code, signal, peak_memory, end_reason
FROM sandboxes WHERE run_id = %(run_id)s ORDER BY attempt

-- name: sandboxes_recent
SELECT sandbox_id, run_id, attempt, status, backend, worker_id, epoch, started_at, ended_at,
       exit_code, signal, peak_memory, end_reason
FROM sandboxes ORDER BY started_at DESC, sandbox_id LIMIT %(limit)s

-- name: sandboxes_of_run_attempt
SELECT sandbox_id, run_id, attempt, status, backend, worker_id, epoch, started_at, ended_at,
       exit_code, signal, peak_memory, end_reason
FROM sandboxes WHERE run_id = %(run_id)s AND attempt = %(attempt)s

-- Dashboard follow-ups (issue 11) -----------------------------------------------------------

-- name: ui_dead_lettered
SELECT count(*) AS n FROM dead_letters WHERE run_id = %(run_id)s

-- Isolated graphs ---------------------------------------------------------------------------
-- A worker that cannot make sandboxes serves the graph versions without `tier: isolated`
-- only; one read answers both (every version, and whether it is isolated).

-- name: graph_versions_tiers
SELECT name, version, coalesce(definition ->> 'tier' = 'isolated', false) AS isolated
FROM graphs

-- Schedules (ratchet.store.schedules): one row per tenant and schedule name.

-- name: schedule_declare
-- A schedule declared in code, written by each worker that has it: its spec follows the
-- code, its pause and last fired tick stay; one added through the API under that name
-- stays the API's.
INSERT INTO schedules (tenant_id, name, workflow, cron, every_s, tz, missed, source, paused,
                       created_at, last_tick)
VALUES (%(tenant_id)s, %(name)s, %(workflow)s, %(cron)s, %(every_s)s, %(tz)s, %(missed)s, 'code', 0, %(now)s, NULL)
ON CONFLICT (tenant_id, name) DO UPDATE
SET workflow = excluded.workflow, cron = excluded.cron, every_s = excluded.every_s,
    tz = excluded.tz, missed = excluded.missed
WHERE schedules.source = 'code'

-- name: schedule_add
INSERT INTO schedules (tenant_id, name, workflow, cron, every_s, tz, missed, source, paused,
                       created_at, last_tick)
VALUES (%(tenant_id)s, %(name)s, %(workflow)s, %(cron)s, %(every_s)s, %(tz)s, %(missed)s, 'api', 0, %(now)s, NULL)
ON CONFLICT (tenant_id, name) DO NOTHING

-- name: schedule_change
UPDATE schedules
SET workflow = %(workflow)s, cron = %(cron)s, every_s = %(every_s)s, tz = %(tz)s, missed = %(missed)s
WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: schedule_delete
DELETE FROM schedules WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: schedules_all
-- What every worker's scheduler reads each pass: every schedule of every tenant.
SELECT tenant_id, name, workflow, cron, every_s, tz, missed, source, paused, created_at,
       last_tick
FROM schedules ORDER BY tenant_id, name

-- name: schedules_of_tenant
SELECT tenant_id, name, workflow, cron, every_s, tz, missed, source, paused, created_at,
       last_tick
FROM schedules WHERE tenant_id = %(tenant_id)s ORDER BY name

-- name: schedule_get
SELECT tenant_id, name, workflow, cron, every_s, tz, missed, source, paused, created_at,
       last_tick
FROM schedules WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: schedule_advance
-- Only forward: a slower worker that fired an older tick never moves it back.
UPDATE schedules SET last_tick = %(tick)s
WHERE tenant_id = %(tenant_id)s AND name = %(name)s AND (last_tick IS NULL OR last_tick < %(tick)s)

-- name: schedule_pause
UPDATE schedules SET paused = 1 WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- name: schedule_resume
-- The ticks that passed while paused are not owed: the schedule goes on from the tick given.
UPDATE schedules
SET paused = 0,
    last_tick = CASE WHEN last_tick IS NULL OR last_tick < %(tick)s THEN %(tick)s ELSE last_tick END
WHERE tenant_id = %(tenant_id)s AND name = %(name)s

-- Queues (migration 022, ratchet.store.queues): limits every claimer of a limited queue
-- reads under the queue's row lock, so concurrent claimers of it take turns.

-- name: queue_declare
-- An app's declaration; limits last changed through the API stand.
INSERT INTO queues (name, concurrency, per_key_concurrency, rate_limit, rate_per_s,
                    hold_while_parked, set_by, updated_at)
VALUES (%(name)s, %(concurrency)s, %(per_key_concurrency)s, %(rate_limit)s, %(rate_per_s)s,
        %(hold_while_parked)s, %(set_by)s, ratchet_now())
ON CONFLICT (name) DO UPDATE
SET concurrency = excluded.concurrency, per_key_concurrency = excluded.per_key_concurrency,
    rate_limit = excluded.rate_limit, rate_per_s = excluded.rate_per_s,
    hold_while_parked = excluded.hold_while_parked, updated_at = excluded.updated_at
WHERE queues.set_by <> 'api'

-- name: queue_set
UPDATE queues SET concurrency = %(concurrency)s, per_key_concurrency = %(per_key_concurrency)s,
                  rate_limit = %(rate_limit)s, rate_per_s = %(rate_per_s)s,
                  hold_while_parked = %(hold_while_parked)s, set_by = %(set_by)s,
                  updated_at = ratchet_now()
WHERE name = %(name)s

-- name: queue_lock
SELECT name, concurrency, per_key_concurrency, rate_limit, rate_per_s, hold_while_parked
FROM queues WHERE name = %(name)s
FOR UPDATE

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
WHERE name = ANY(%(queues)s::text[])
  AND (concurrency IS NOT NULL OR per_key_concurrency IS NOT NULL OR rate_limit IS NOT NULL)

-- name: queue_usage
-- Counted along runs_running (or runs_status, for parked runs a queue holds slots for) and
-- runs_first_started.
SELECT (SELECT count(*) FROM runs
        WHERE queue = %(queue)s AND status = ANY(%(statuses)s::text[])
          -- a delayed or debounced start waits on no key: not begun, it holds no slot
          AND NOT (status = 'waiting' AND waiting_for IS NULL)) AS in_flight,
       (SELECT count(*) FROM runs
        WHERE queue = %(queue)s
          AND first_started_at > ratchet_now() - make_interval(secs => %(per_s)s)) AS started

-- name: queue_pick
-- A limited queue's ready runs in priority then age order, those whose key has
-- per_key_concurrency runs in flight already left out (each key's n-th ready run is
-- eligible while the key's runs in flight plus n stay within it). With fresh false, only
-- runs driven before (the rate allows no first drive now).
WITH busy AS (
    SELECT concurrency_key, count(*) AS n FROM runs
    WHERE queue = %(queue)s AND status = ANY(%(statuses)s::text[])
      AND NOT (status = 'waiting' AND waiting_for IS NULL)
      AND concurrency_key IS NOT NULL
    GROUP BY concurrency_key
), ready AS (
    SELECT run_id, priority, created_at, concurrency_key,
           first_started_at IS NOT NULL AS started,
           row_number() OVER (PARTITION BY concurrency_key
                              ORDER BY priority DESC, created_at, run_id) AS nth
    FROM runs
    WHERE status = 'queued' AND queue = %(queue)s
      AND (%(fresh)s OR first_started_at IS NOT NULL)
      AND (workflow, workflow_version) IN (
          SELECT * FROM unnest(%(served_workflows)s::text[], %(served_versions)s::text[]))
)
SELECT ready.run_id, ready.priority, ready.created_at, ready.started
FROM ready LEFT JOIN busy ON busy.concurrency_key = ready.concurrency_key
WHERE %(per_key)s::integer IS NULL OR ready.concurrency_key IS NULL
   OR ready.nth + coalesce(busy.n, 0) <= %(per_key)s::integer
ORDER BY ready.priority DESC, ready.created_at, ready.run_id
LIMIT %(limit)s

-- name: queue_lock_runs
SELECT run_id FROM runs
WHERE run_id = ANY(%(ids)s::text[]) AND status = 'queued'
FOR UPDATE SKIP LOCKED

-- name: runs_mark_started
UPDATE runs SET first_started_at = ratchet_now()
WHERE run_id = ANY(%(ids)s::text[]) AND first_started_at IS NULL

-- name: run_first_started
SELECT first_started_at FROM runs WHERE run_id = %(run_id)s

-- name: runs_keys
SELECT concurrency_key FROM runs WHERE queue = %(queue)s
