-- Single-row insert: a box of the data's average size (:bw x :bh) at a
-- random data centre.  Variables: tbl, n, bw, bh.
\set k random(1, :n)
INSERT INTO :tbl (id, b, t)
SELECT -1, box(point(x, y), point(x + :bw, y + :bh)), 0
FROM bench_centers WHERE id = :k;
