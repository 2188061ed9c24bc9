-- resources.state_id without a row-by-row foreign key. The foreign key checked every row a write opens with
-- its own lookup and row lock of the state (200,000 of them for a large POST), although every writer of
-- resource rows already holds that state's row FOR UPDATE. The two guarantees it gave are kept by triggers:
--
-- * no resource row for a missing state: after each INSERT or COPY into resources, one statement-level check
--   takes each distinct state_id of the new rows FOR KEY SHARE (as the foreign key did, so a concurrent
--   deletion of that state waits for this transaction, or this one fails once the deletion has committed),
--   and refuses the statement with foreign_key_violation when the state does not exist; a row's state_id
--   never changes;
-- * deleting a state deletes its resource rows (and, by their own foreign key, their resource_changes).
ALTER TABLE resources DROP CONSTRAINT resources_state_id_fkey;

CREATE FUNCTION resources_check_states() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted bigint;
BEGIN
    FOR wanted IN SELECT DISTINCT state_id FROM opened LOOP
        PERFORM FROM states WHERE id = wanted FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE foreign_key_violation USING
                MESSAGE = format('resource rows for state %s, which does not exist', wanted),
                TABLE = 'resources', COLUMN = 'state_id';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER resources_check_states AFTER INSERT ON resources
    REFERENCING NEW TABLE AS opened FOR EACH STATEMENT EXECUTE FUNCTION resources_check_states();

CREATE FUNCTION resources_keep_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE integrity_constraint_violation USING
        MESSAGE = 'a resource row belongs to its state for good: state_id cannot change',
        TABLE = 'resources', COLUMN = 'state_id';
END
$$;

CREATE TRIGGER resources_keep_state BEFORE UPDATE OF state_id ON resources
    FOR EACH ROW WHEN (NEW.state_id IS DISTINCT FROM OLD.state_id) EXECUTE FUNCTION resources_keep_state();

CREATE FUNCTION states_delete_resources() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM resources WHERE state_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER states_delete_resources AFTER DELETE ON states
    FOR EACH ROW EXECUTE FUNCTION states_delete_resources();
