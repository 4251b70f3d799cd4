-- What a person's approval of a guard's pause let the run go over to: the limits it moved
-- (JSON, e.g. {"budget_tokens": 5000}), journaled by the run's drive in approval_decided.
-- NULL for every other approval.
ALTER TABLE approvals ADD COLUMN granted TEXT;
