# Logical backups: pg_dump of a database with amrtree indexes of every kind
# (storage parameters, a partial and an expression index, the point,
# polygon and circle classes, an exclusion constraint, a partitioned
# index, PostGIS geometry where PostGIS is installed), restored with
# pg_restore -j 2 (two builds at once) and from a plain-format dump with
# psql.  In each copy every index has the same definition, passes
# amrtree_check, is chosen by the planner, and answers like a sequential
# scan; every strategy returns the same rows as in the source; the
# exclusion constraint still refuses an overlap.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('dump');
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE src');
my $postgis = $node->safe_psql('src',
	q{SELECT count(*) FROM pg_available_extensions WHERE name = 'postgis'}) eq '1';

$node->safe_psql('src', 'CREATE EXTENSION amrtree');
amr_load_porto($node, 'trips', 20000, 25, 'src');
$node->safe_psql('src', q{
INSERT INTO trips SELECT 100000 + i, NULL, 0 FROM generate_series(1, 20) i;
DELETE FROM trips WHERE id % 11 = 0;
CREATE INDEX trips_b ON trips USING amrtree (b) WITH (pmem_budget = '30%', tiering = off);
CREATE INDEX trips_b_third ON trips USING amrtree (b) WHERE id % 3 = 0;
CREATE INDEX trips_centre ON trips USING amrtree (box(center(b), center(b)));
CREATE TABLE shapes (id int, p point, pg polygon, c circle);
INSERT INTO shapes SELECT i, point(i % 100, i / 100),
  polygon(box(point(i % 100, i / 100), point(i % 100 + 2, i / 100 + 1))),
  circle(point(i % 100, i / 100), 0.5 + i % 3)
FROM generate_series(1, 5000) i;
CREATE INDEX shapes_p ON shapes USING amrtree (p);
CREATE INDEX shapes_pg ON shapes USING amrtree (pg);
CREATE INDEX shapes_c ON shapes USING amrtree (c);
CREATE TABLE booking (room int, during box, EXCLUDE USING amrtree (during WITH &&));
INSERT INTO booking VALUES (1, box '((0,0),(1,1))'), (2, box '((2,2),(3,3))');
CREATE TABLE parted (k int, b box) PARTITION BY RANGE (k);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100);
CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (100) TO (200);
INSERT INTO parted SELECT i % 200, box(point(i, i), point(i + 1.5, i + 1.5)) FROM generate_series(1, 4000) i;
CREATE INDEX parted_b ON parted USING amrtree (b);
});
if ($postgis)
{
	$node->safe_psql('src', q{
CREATE EXTENSION amrtree_postgis CASCADE;
CREATE TABLE geo (id int, g geometry);
INSERT INTO geo SELECT i, ST_MakeEnvelope(i % 70, i / 70, i % 70 + 0.7, i / 70 + 0.4) FROM generate_series(1, 3000) i;
CREATE INDEX geo_g ON geo USING amrtree (g);
});
}
amr_setup_parity($node, 'src');
amr_porto_windows($node, 'src');
$node->safe_psql('src', 'ANALYZE');

# every amrtree index of a database: name, definition, storage parameters
my $definitions = q{
SELECT string_agg(c.relname || ': ' || pg_get_indexdef(c.oid) || ' ' || coalesce(c.reloptions::text, ''),
                  E'\n' ORDER BY c.relname)
FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE a.amname = 'amrtree' AND c.relkind IN ('i', 'I')};
my $source_definitions = $node->safe_psql('src', $definitions);
my $source_fingerprint = amr_fingerprint($node, 'trips', 'src');
my ($source_mismatch) = amr_parity_mismatches($node, 'trips', 'src');
is($source_mismatch, 0, 'the source agrees with a sequential scan');

# the same query through the index (which it must use) and a sequential scan
sub index_agrees
{
	my ($db, $index, $query) = @_;
	my $plan = $node->safe_psql($db, "SET enable_seqscan = off; EXPLAIN (COSTS OFF) $query");
	my ($with, $without) = amr_with_and_without_index($node, $db, $query);
	my $ok = $plan =~ /\Q$index\E/ && $with eq $without && $with ne '';
	diag("plan:\n$plan\nthrough the index: $with\nsequential: $without") unless $ok;
	return $ok;
}

sub check_copy
{
	my ($db, $how) = @_;
	is($node->safe_psql($db, $definitions), $source_definitions,
		"$how: every amrtree index has the source's definition and storage parameters");
	is($node->safe_psql($db, q{
SELECT bool_and(amrtree_check(c.oid))
FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE a.amname = 'amrtree' AND c.relkind = 'i'}), 't', "$how: amrtree_check passes for every index");
	is(amr_fingerprint($node, 'trips', $db), $source_fingerprint,
		"$how: every strategy returns the source's rows on every window");
	my ($mismatch, $rows) = amr_parity_mismatches($node, 'trips', $db);
	is($mismatch, 0, "$how: and agrees with a sequential scan ($rows rows)");
	is(amr_knn_mismatches($node, 'trips', 15, 10, $db), 0, "$how: nearest-neighbour order too");
	ok(index_agrees($db, 'trips_b_third',
		q{SELECT count(*), sum(id) FROM trips WHERE id % 3 = 0 AND b && box '((-8.64,41.14),(-8.6,41.17))'}),
		"$how: the partial index");
	ok(index_agrees($db, 'trips_centre',
		q{SELECT count(*), sum(id) FROM trips WHERE box(center(b), center(b)) <@ box '((-8.64,41.14),(-8.6,41.17))'}),
		"$how: the expression index");
	ok(index_agrees($db, 'shapes_p', q{SELECT count(*), sum(id) FROM shapes WHERE p <@ box '((10,10),(30,25))'}),
		"$how: points");
	ok(index_agrees($db, 'shapes_pg', q{SELECT count(*), sum(id) FROM shapes WHERE pg && polygon '((10,10),(30,12),(20,25))'}),
		"$how: polygons");
	ok(index_agrees($db, 'shapes_c', q{SELECT count(*), sum(id) FROM shapes WHERE c && circle '<(40,20),6>'}),
		"$how: circles");
	ok(index_agrees($db, 'parted_', q{SELECT count(*), sum(k) FROM parted WHERE b && box '((500,500),(2500,2600))'}),
		"$how: the partitioned index");
	my ($ret, $out, $err) = $node->psql($db, q{INSERT INTO booking VALUES (3, box '((0.5,0.5),(1.5,1.5))')});
	like($err, qr/conflicting key value violates exclusion constraint/, "$how: the exclusion constraint refuses an overlap");
	if ($postgis)
	{
		ok(index_agrees($db, 'geo_g', q{SELECT count(*), sum(id) FROM geo WHERE g && ST_MakeEnvelope(10, 5, 30, 20)}),
			"$how: PostGIS geometry");
	}
}

my $dir = PostgreSQL::Test::Utils::tempdir();
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dir/src.dump", '-d', $node->connstr('src') ],
	'pg_dump, custom format');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok(
	[ 'pg_restore', '-j', '2', '-d', $node->connstr('restored'), "$dir/src.dump" ],
	'pg_restore -j 2');
check_copy('restored', 'pg_restore -j 2');

$node->command_ok([ 'pg_dump', '-Fp', '-f', "$dir/src.sql", '-d', $node->connstr('src') ],
	'pg_dump, plain format');
$node->safe_psql('postgres', 'CREATE DATABASE replayed');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', "$dir/src.sql", '-d', $node->connstr('replayed') ],
	'the plain dump replayed with psql');
check_copy('replayed', 'psql < plain dump');

# the source is untouched by all this
is(amr_fingerprint($node, 'trips', 'src'), $source_fingerprint, 'the source still returns the same rows');

$node->stop;
done_testing();
