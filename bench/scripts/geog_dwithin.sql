-- PostGIS geography: ST_DWithin around a data box's centre, radius r metres
-- (PostGIS's planner support gives the index g && _st_expand(q, r)).
-- Variables (pgbench -D): tbl (table with column g geography), n (rows in
-- bench_centers), r.  See bench/README.md.
\set k random(1, :n)
SELECT count(*) FROM :tbl
WHERE ST_DWithin(g, (SELECT ST_MakePoint(x, y)::geography FROM bench_centers WHERE id = :k), :r);
