# The environment amrtree depends on, and what happens when it is wrong:
# no shared_preload_libraries, a pool from another cluster or of another
# format version, a wiped pool (the index says REINDEX instead of returning
# nothing), and a pool on an ordinary disk file.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Copy;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my ($ret, $out, $err);

# --- without shared_preload_libraries
my $plain = amr_node('plain', preload => 0);
$plain->start;
($ret, $out, $err) = $plain->psql('postgres', 'CREATE EXTENSION amrtree');
is($ret, 0, 'CREATE EXTENSION works without the preload');
$plain->safe_psql('postgres', q{CREATE TABLE t (b box); INSERT INTO t VALUES ('((0,0),(1,1))')});
($ret, $out, $err) = $plain->psql('postgres', 'CREATE INDEX t_b ON t USING amrtree (b)');
like($err, qr/amrtree must be loaded via shared_preload_libraries/, 'CREATE INDEX explains the missing preload');
like($err, qr/HINT:  Add amrtree to shared_preload_libraries/, '... with a hint');
$plain->stop;

# an index built with the preload, then the server restarted without it:
# reads still work (the planner avoids the index), writes are refused
my $node = amr_node('main');
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
INSERT INTO t SELECT i, box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 2000) i;
CREATE INDEX t_b ON t USING amrtree (b);
});
$node->stop;
$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "''");
$node->start;
is($node->safe_psql('postgres', q{SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'}),
	'12', 'queries still answer (by sequential scan) without the preload');
($ret, $out, $err) = $node->psql('postgres', q{INSERT INTO t VALUES (0, '((0,0),(1,1))')});
like($err, qr/amrtree must be loaded via shared_preload_libraries/, 'writes are refused without the preload');
($ret, $out, $err) = $node->psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'});
like($err, qr/amrtree must be loaded via shared_preload_libraries/, 'a forced index scan is refused, not answered empty');
$node->stop;
$node->adjust_conf('postgresql.conf', 'shared_preload_libraries', "'amrtree'");
$node->start;
is($node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'}),
	'12', 'with the preload back, the index answers');
$node->stop;

# --- a pool from another cluster
my $other = amr_node('other');
my $main_pool = amr_pool_path('main');
$other->append_conf('postgresql.conf', "amrtree.pmem_path = '$main_pool'\n");
$other->start;
$other->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box)');
($ret, $out, $err) = $other->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
like($err, qr/PMEM pool "\Q$main_pool\E" is not usable: the PMEM pool belongs to another cluster/,
	'a foreign pool is refused');
like($err, qr/DETAIL:  The pool belongs to the cluster with system identifier \d+, this cluster's is \d+/,
	'... naming both system identifiers');
ok($other->log_contains('the PMEM pool belongs to another cluster'), 'the refusal is logged at startup');
$other->stop;

# --- another format version (patch a copy of the header)
my $patched = amr_pool_path('patched');
copy($main_pool, $patched) or die "copy: $!";
{
	open my $fh, '+<:raw', $patched or die;
	local $/;
	my $data = <$fh>;
	my $at = index($data, "AMRTREE1");
	die 'pool header not found' if $at < 0;
	seek $fh, $at + 8, 0;
	print $fh pack('V', 99);
	close $fh;
}
my $vers = amr_node('version', pool => $patched, keep_pool => 1);
$vers->start;
$vers->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box)');
($ret, $out, $err) = $vers->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
like($err, qr/incompatible format/, 'a pool of another format version is refused');
like($err, qr/format version 99/, '... naming the version');
$vers->stop;
unlink $patched;

# --- a wiped pool: the index reports REINDEX instead of returning nothing
$node->start;
$node->stop;
unlink $main_pool;
$node->start;
($ret, $out, $err) = $node->psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'});
like($err, qr/amrtree index "t_b" has no tree in the PMEM pool/, 'a missing tree is an error');
like($err, qr/HINT:  Rebuild it: REINDEX INDEX public\.t_b;/, '... with the REINDEX hint');
$node->safe_psql('postgres', 'REINDEX INDEX t_b');
is($node->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'}),
	'12', 'after REINDEX the index answers again');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and it is valid');
$node->stop;

# --- the default location: a disk file in the data directory (msync)
my $disk = amr_node('disk', pool => undef, pmem_size => '64MB');
$disk->start;
ok($disk->log_contains('pg_amrtree/pmem.pool.*a disk file \(persisted with msync\)'),
	'the default pool lives in the data directory and is persisted with msync');
$disk->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
INSERT INTO t SELECT i, box(point(i, 0), point(i + 0.5, 1)) FROM generate_series(1, 3000) i;
CREATE INDEX t_b ON t USING amrtree (b);
INSERT INTO t SELECT i, box(point(i, 2), point(i + 0.5, 3)) FROM generate_series(1, 500) i;
});
my $mode = (stat($disk->data_dir . '/pg_amrtree/pmem.pool'))[2] & 07777;
is(sprintf('%o', $mode), '600', 'the pool file is private to the server (0600)');
$mode = (stat($disk->data_dir . '/pg_amrtree'))[2] & 07777;
is(sprintf('%o', $mode), '700', 'its directory too (0700)');
$disk->restart;
is($disk->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((100,0),(200,3))'}),
	'202', 'a disk-backed pool survives a restart');
is($disk->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and stays valid');

# amrtree.pmem_path is not visible to ordinary users
$disk->safe_psql('postgres', 'CREATE ROLE nobody_special LOGIN');
($ret, $out, $err) = $disk->psql('postgres', 'SHOW amrtree.pmem_path', extra_params => [ '-U', 'nobody_special' ]);
like($err, qr/permission denied|must be superuser|privileges of pg_read_all_settings/, 'pmem_path is hidden from ordinary users');
$disk->stop;

done_testing();
