# pg_upgrade of a cluster with amrtree indexes.  pg_upgrade restores the
# schema into the new cluster (building every index on an empty table) and
# then puts the old cluster's files in place of the new ones, under the same
# relfilenodes; the old pool stays behind.  The upgraded indexes must never
# answer from a tree built during the schema restore (that tree is empty):
# from the first query on, every query returns what a sequential scan
# returns; then the indexes are rebuilt in the background and used again,
# valid and equal to a sequential scan.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# both with amrtree's default pool, a file in the data directory
my $old = amr_node('old', pool => undef);
$old->start;
$old->safe_psql('postgres', 'CREATE EXTENSION amrtree');
amr_load_porto($old, 'trips', 20000, 26);
$old->safe_psql('postgres', q{
CREATE INDEX trips_b ON trips USING amrtree (b) WITH (pmem_budget = '40%');
CREATE INDEX trips_b_third ON trips USING amrtree (b) WHERE id % 3 = 0;
CREATE TABLE pts (id int, p point);
INSERT INTO pts SELECT i, point(i % 100, i / 100) FROM generate_series(1, 5000) i;
CREATE INDEX pts_p ON pts USING amrtree (p);
CREATE UNLOGGED TABLE scratch (id int, b box);
INSERT INTO scratch SELECT i, box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 1000) i;
CREATE INDEX scratch_b ON scratch USING amrtree (b);
});
amr_setup_parity($old);
amr_porto_windows($old);
my $fingerprint = amr_fingerprint($old, 'trips');
my ($mismatch, $rows) = amr_parity_mismatches($old, 'trips');
is($mismatch, 0, "before the upgrade the index agrees with a sequential scan ($rows rows)");
$old->stop;

my $new = amr_node('new', pool => undef);
my $bindir = $new->config_data('--bindir');
my $workdir = PostgreSQL::Test::Utils::tempdir();
chdir $workdir;    # pg_upgrade writes its scripts into the current directory
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $bindir, '-B', $bindir,
		'-s', $new->host,
		'-p', $old->port, '-P', $new->port
	],
	'pg_upgrade');

$new->start;

# the same query through the index if the planner takes it, and without
sub agrees
{
	my ($query) = @_;
	my ($with, $without) = amr_with_and_without_index($new, 'postgres', $query);
	return $with eq $without && $with ne '' ? 1 : 0;
}
my @queries = (
	q{SELECT count(*), sum(id) FROM trips WHERE b && box '((-8.64,41.14),(-8.6,41.17))'},
	q{SELECT count(*), sum(id) FROM trips WHERE id % 3 = 0 AND b && box '((-8.64,41.14),(-8.6,41.17))'},
	q{SELECT count(*), sum(id) FROM pts WHERE p <@ box '((10,10),(30,25))'},
	q{SELECT count(*), sum(id) FROM scratch WHERE b && box '((100,100),(200,200))'});
my $agree = 0;
$agree += agrees($_) for @queries;
is($agree, scalar @queries, 'right after the upgrade every query returns what a sequential scan returns');
my ($m) = amr_parity_mismatches($new, 'trips');
is($m, 0, 'so does every strategy on every window');

sub uses
{
	my ($index, $query) = @_;
	return $new->safe_psql('postgres', "SET enable_seqscan = off; EXPLAIN (COSTS OFF) $query") =~ /\Q$index\E/;
}
my $deadline = time + 120;
my $back = 0;
while (time < $deadline)
{
	if (uses('trips_b', $queries[0]) && uses('trips_b_third', $queries[1]) && uses('pts_p', $queries[2])
		&& uses('scratch_b', $queries[3]))
	{
		$back = 1;
		last;
	}
	usleep(300_000);
}
ok($back, 'the upgraded indexes are rebuilt in the background and used again');
ok($new->log_contains('amrtree: rebuilt index "public.trips_b"'), 'the log says trips_b was rebuilt');
$agree = 0;
$agree += agrees($_) for @queries;
is($agree, scalar @queries, 'through the rebuilt indexes every query returns what a sequential scan returns');
is(amr_fingerprint($new, 'trips'), $fingerprint, 'every strategy returns the rows it returned before the upgrade');
is($new->safe_psql('postgres', q{
SELECT bool_and(amrtree_check(c.oid))
FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'amrtree' AND c.relkind = 'i'}),
	't', 'amrtree_check passes for every index');
is($new->safe_psql('postgres', q{SELECT reloptions::text FROM pg_class WHERE relname = 'trips_b'}),
	'{pmem_budget=40%}', 'the storage parameters came through');
is($new->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname LIKE '%\_cc%'}),
	'0', 'no leftover of the rebuilds');

# ALTER EXTENSION UPDATE from the first release: an index built under 0.1
# keeps working through every update script, and the updated extension has
# exactly the objects (functions, operator classes, their operators and
# support functions, privileges) of one installed at the current version.
$new->safe_psql('postgres', 'CREATE DATABASE ext_fresh');
$new->safe_psql('postgres', 'CREATE DATABASE ext_updated');
$new->safe_psql('ext_fresh', 'CREATE EXTENSION amrtree');
$new->safe_psql('ext_updated', q{
CREATE EXTENSION amrtree VERSION '0.1';
CREATE TABLE boxes (id int, b box);
INSERT INTO boxes SELECT i, box(point(i % 100, i / 100), point(i % 100 + 0.5, i / 100 + 0.5))
FROM generate_series(1, 5000) i;
CREATE INDEX boxes_b ON boxes USING amrtree (b);
});
$new->safe_psql('ext_updated', 'ALTER EXTENSION amrtree UPDATE');
is($new->safe_psql('ext_updated', q{SELECT extversion FROM pg_extension WHERE extname = 'amrtree'}),
	$new->safe_psql('ext_fresh', q{SELECT extversion FROM pg_extension WHERE extname = 'amrtree'}),
	'ALTER EXTENSION UPDATE reaches the default version');
my $catalog = q{
SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'amrtree') ORDER BY 1;
SELECT p.oid::regprocedure, pg_get_function_result(p.oid), p.provolatile, p.proparallel,
       p.proisstrict, p.prosecdef, p.prosrc, p.proacl
FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
WHERE d.deptype = 'e' AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'amrtree')
ORDER BY p.oid::regprocedure::text;
SELECT c.opcname, c.opcintype::regtype, c.opcdefault, c.opckeytype::regtype, f.opfname
FROM pg_opclass c JOIN pg_opfamily f ON f.oid = c.opcfamily JOIN pg_am a ON a.oid = c.opcmethod
WHERE a.amname = 'amrtree' ORDER BY 1, 2;
SELECT f.opfname, o.amopstrategy, o.amoplefttype::regtype, o.amoprighttype::regtype,
       o.amopopr::regoperator, o.amoppurpose, o.amopsortfamily
FROM pg_amop o JOIN pg_opfamily f ON f.oid = o.amopfamily JOIN pg_am a ON a.oid = f.opfmethod
WHERE a.amname = 'amrtree' ORDER BY 1, 2, 3::text, 4::text;
SELECT f.opfname, p.amprocnum, p.amproclefttype::regtype, p.amprocrighttype::regtype,
       p.amproc::regprocedure
FROM pg_amproc p JOIN pg_opfamily f ON f.oid = p.amprocfamily JOIN pg_am a ON a.oid = f.opfmethod
WHERE a.amname = 'amrtree' ORDER BY 1, 2, 3::text, 4::text};
is($new->safe_psql('ext_updated', $catalog), $new->safe_psql('ext_fresh', $catalog),
	'the updated extension has the objects of a fresh install');
my ($with, $without) = amr_with_and_without_index($new, 'ext_updated',
	q{SELECT count(*), sum(id) FROM boxes WHERE b && box '((10,10),(20,20))'});
is($with, $without, 'an index built under 0.1 answers as a sequential scan after the update');
($with, $without) = amr_with_and_without_index($new, 'ext_updated',
	q{SELECT string_agg((b <-> point '(3.2,3.2)')::text, ',') FROM
	  (SELECT b FROM boxes ORDER BY b <-> point '(3.2,3.2)' LIMIT 5) s});
is($with, $without, 'and orders by distance (an operator 0.4 added to its class)');
like($new->safe_psql('ext_updated',
		q{SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT b FROM boxes ORDER BY b <-> point '(3,3)' LIMIT 5}),
	qr/boxes_b/, 'through the index built under 0.1');
is($new->safe_psql('ext_updated', q{SELECT amrtree_check('boxes_b')}), 't', 'which amrtree_check finds sound');

$new->stop;
done_testing();
