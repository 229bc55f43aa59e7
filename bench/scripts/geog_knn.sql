-- PostGIS geography: the 10 nearest to a data box's centre (ORDER BY <->).
-- Variables (pgbench -D): tbl (table with column g geography), n (rows in
-- bench_centers).  See bench/README.md.
\set k random(1, :n)
SELECT id FROM :tbl
ORDER BY g <-> (SELECT ST_MakePoint(x, y)::geography FROM bench_centers WHERE id = :k) LIMIT 10;
