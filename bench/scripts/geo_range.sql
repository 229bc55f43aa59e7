-- PostGIS range query: geometries whose box meets a window centred on a
-- random data box.  Variables (pgbench -D): tbl (table with column g
-- geometry), n (rows in bench_centers), hw, hh.  See bench/README.md.
\set k random(1, :n)
SELECT count(*) FROM :tbl
WHERE g && (SELECT ST_MakeEnvelope(x - :hw, y - :hh, x + :hw, y + :hh) FROM bench_centers WHERE id = :k);
