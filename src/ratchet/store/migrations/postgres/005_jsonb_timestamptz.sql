-- Runs as an operator reads them with psql: payloads, inputs, outputs and responses are
-- jsonb (payload->>'error'), times are timestamptz (expires_at > now()). Ratchet itself
-- still works in Unix seconds: its connections read timestamptz as epoch seconds and jsonb
-- as text (store/postgres.py), and it writes times through to_timestamp().
--
-- jsonb keeps numbers as numeric and refuses the NUL character (\u0000). Since this
-- migration, Ratchet writes numbers as jsonb gives them back (model.dumps) and refuses NUL
-- at the door (to_json). Rows written before it are converted as follows:
-- * a journal event's hash covers the exact text it was written with; an event whose text
--   jsonb may not give back as it was (a number with an exponent, a -0.0, a NUL) keeps
--   that text in payload_text, from which it is read and verified; its jsonb payload (what
--   psql shows) has the numbers as jsonb writes them and U+FFFD for a NUL;
-- * other JSON values (inputs, outputs, signals, responses) become jsonb as they are, with
--   U+FFFD for a NUL;
-- * a journal event's time keeps the microsecond its hash was computed with (six decimals
--   of the float, rounded half to even, as Python formats it); other times are rounded to
--   the microsecond.

-- The server's clock plus the session's ratchet.skew (seconds; tests set it to move time
-- forward without sleeping through a lease).
DROP FUNCTION ratchet_now();
CREATE FUNCTION ratchet_now() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    SELECT clock_timestamp() + make_interval(
        secs => coalesce(nullif(current_setting('ratchet.skew', true), '')::float8, 0))
$$;

-- The JSON escape of a NUL (one not itself escaped), as U+FFFD.
CREATE FUNCTION pg_temp.ratchet_no_nul(value text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT regexp_replace(value, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\ufffd', 'g')
$$;

-- A float of Unix seconds at the microsecond Python's f"{at:.6f}" names: the float's exact
-- value (for at >= 1, a multiple of 2^-52: whole seconds plus 52 bits of fraction), to six
-- decimals, half to even.
CREATE FUNCTION pg_temp.ratchet_exact_time(at float8) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT timestamp with time zone 'epoch' + (
        whole + CASE WHEN part > 0.5 OR (part = 0.5 AND mod(whole, 2) = 1) THEN 1 ELSE 0 END
    ) * interval '1 microsecond'
    FROM (SELECT floor(us) AS whole, us - floor(us) AS part
          FROM (SELECT (floor(at)::bigint::numeric
                        + ((at - floor(at)) * 4503599627370496)::bigint
                          * 0.0000000000000002220446049250313080847263336181640625
                       ) * 1000000 AS us) AS exact) AS split
$$;

-- Python wrote floats of 1e16 and more as 1e+16 and negative zero as -0.0; a string may
-- look like either too, which only keeps a text that was not needed.
ALTER TABLE journal_events ADD COLUMN payload_text text;
UPDATE journal_events SET payload_text = payload
WHERE payload ~ '[0-9]e\+[0-9]|-0\.0[,\]}]|\\u0000';
ALTER TABLE journal_events
    ALTER COLUMN payload TYPE jsonb USING pg_temp.ratchet_no_nul(payload)::jsonb,
    ALTER COLUMN at TYPE timestamptz USING pg_temp.ratchet_exact_time(at);

ALTER TABLE runs
    ALTER COLUMN input TYPE jsonb USING pg_temp.ratchet_no_nul(input)::jsonb,
    ALTER COLUMN output TYPE jsonb USING pg_temp.ratchet_no_nul(output)::jsonb,
    ALTER COLUMN not_before TYPE timestamptz USING to_timestamp(not_before),
    ALTER COLUMN created_at TYPE timestamptz USING to_timestamp(created_at),
    ALTER COLUMN updated_at TYPE timestamptz USING to_timestamp(updated_at);

ALTER TABLE run_locks
    ALTER COLUMN expires_at TYPE timestamptz USING to_timestamp(expires_at);

ALTER TABLE side_effect_receipts
    ALTER COLUMN response TYPE jsonb USING pg_temp.ratchet_no_nul(response)::jsonb,
    ALTER COLUMN claimed_at TYPE timestamptz USING to_timestamp(claimed_at),
    ALTER COLUMN settled_at TYPE timestamptz USING to_timestamp(settled_at);

ALTER TABLE dead_letters
    ALTER COLUMN at TYPE timestamptz USING to_timestamp(at);

ALTER TABLE signals
    ALTER COLUMN payload TYPE jsonb USING pg_temp.ratchet_no_nul(payload)::jsonb,
    ALTER COLUMN sent_at TYPE timestamptz USING to_timestamp(sent_at);

ALTER TABLE workers
    ALTER COLUMN started_at TYPE timestamptz USING to_timestamp(started_at),
    ALTER COLUMN seen_at TYPE timestamptz USING to_timestamp(seen_at);

DROP FUNCTION pg_temp.ratchet_no_nul(text);
DROP FUNCTION pg_temp.ratchet_exact_time(float8);
