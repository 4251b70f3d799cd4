-- A receipt belongs to one delivery of a step, not to one attempt of it: its identity is
-- (run_id, step_id, delivery), where delivery is the name given to deliver(name=...) or
-- "#n" for the step's n-th unnamed delivery. A later attempt (a retry, or a re-drive after a
-- crash) finds the receipt by that identity and reuses its key and response, so a delivery
-- settled once is never dispatched again. idempotency_key stays the primary key and holds
-- the key sent out: the one derived from the attempt that first claimed it (attempt).
-- settled_by says who settled it: the worker, or a person (ratchet receipts settle).
--
-- Receipts written before this migration were keyed per attempt and name no delivery. They
-- get an identity no new delivery can take ('#legacy:' + their key); a re-drive of the
-- attempt that wrote one still finds it under its key.

ALTER TABLE side_effect_receipts
    ADD COLUMN delivery text,
    ADD COLUMN attempt integer,
    ADD COLUMN settled_by text;
UPDATE side_effect_receipts
SET delivery = '#legacy:' || idempotency_key,
    settled_by = CASE WHEN status = 'settled' THEN 'worker' END;
ALTER TABLE side_effect_receipts ALTER COLUMN delivery SET NOT NULL;
-- The identity's index serves the per-run listing too.
DROP INDEX side_effect_receipts_run;
CREATE UNIQUE INDEX side_effect_receipts_delivery
    ON side_effect_receipts (run_id, step_id, delivery);
