-- The paper's insertion stream: the next :batch rows of table src, in the
-- generator's order (trip by trip), into table sw.  Each row goes through
-- aminsert on its own; a sequence hands batches to concurrent clients.
SELECT nextval('sw_seq') - 1 AS s \gset
INSERT INTO sw SELECT id, b, t FROM src
WHERE id > :s * :batch AND id <= (:s + 1) * :batch;
