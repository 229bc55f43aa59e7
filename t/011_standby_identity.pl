# A standby whose pool the base backup copied follows the primary through
# WAL replay and answers through the index; promoted, it takes writes with
# no REINDEX.  Where a pool does not belong -- a second server pointed at a
# pool or slot file in use, a slot file of another cluster -- each gets a
# clear ERROR, never silently empty results; a truncated or missing slot
# file is replaced and the index that had leaves in it rebuilt, queries
# answering from the table meanwhile.
use strict;
use warnings;
use File::Copy;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# pool and slot file at their defaults, inside the data directory, so that
# the base backup copies them to the standby
my $primary = amr_node('primary', pool => undef, init => { allows_streaming => 1 },
	conf => "amrtree.ssd_size = 16MB\n");
$primary->start;
$primary->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
INSERT INTO t SELECT g, box(point(g % 300, g / 300), point(g % 300 + 1, g / 300 + 1)) FROM generate_series(1, 30000) g;
CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '50%');
SELECT amrtree_settle('t_b', 0);});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
my $lsn0 = $primary->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
$primary->safe_psql('postgres', 'INSERT INTO t SELECT 100000 + g, box(point(g, g), point(g + 1, g + 1)) FROM generate_series(1, 1000) g');
$primary->wait_for_catchup($standby);

# amrtree's resource manager names and describes its records (pg_walinspect)
$primary->safe_psql('postgres', 'CREATE EXTENSION pg_walinspect');
my $wal = qq{FROM pg_get_wal_records_info('$lsn0', pg_current_wal_flush_lsn()) WHERE resource_manager = 'amrtree'};
like($primary->safe_psql('postgres', "SELECT string_agg(DISTINCT record_type, ',') $wal"),
	qr/APPEND/, 'pg_walinspect shows amrtree records by type');
like($primary->safe_psql('postgres', "SELECT description $wal AND record_type = 'APPEND' LIMIT 1"),
	qr{^rel \d+/\d+/\d+ tree \d+/\d+; leaf \d+ v\d+ pos \d+$}, '... and describes them');

my $q = q{SELECT count(*) FROM t WHERE b && box '((10,10),(50,40))'};
my $idx = "SET enable_seqscan = off; SET enable_bitmapscan = off; $q";
my $expected = $primary->safe_psql('postgres', $q);
like($standby->safe_psql('postgres', "SET enable_seqscan = off; EXPLAIN $q"), qr/(Index (Only )?Scan using|Bitmap Index Scan on) t_b/,
	'on the standby, the planner uses the index');
is($standby->safe_psql('postgres', $idx), $expected, 'and it returns what the primary returns');
is($standby->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'amrtree_check holds on the standby');
my ($ret, $out, $err) = $standby->psql('postgres', q{SELECT amrtree_settle('t_b', 0)});
like($err, qr/cannot execute amrtree_settle\(\) during recovery/, 'amrtree_settle is refused during recovery');

# promotion: the replayed pool is the index; no REINDEX
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
is($standby->safe_psql('postgres', $idx), $expected, 'after promotion the index answers at once');
ok(!$standby->log_contains('REINDEX'), 'and nothing asked for a REINDEX');
$standby->safe_psql('postgres', 'INSERT INTO t SELECT 200000 + g, box(point(g, g), point(g + 1, g + 1)) FROM generate_series(1, 500) g');
is($standby->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the promoted server takes writes, and the index is valid');
$standby->restart;
is($standby->safe_psql('postgres', $idx), $standby->safe_psql('postgres', $q),
	'it keeps working across a restart');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the primary is unaffected');
$standby->stop;

# a second server pointed at the primary's pool or slot file while it runs
my $pool = $primary->data_dir . '/pg_amrtree/pmem.pool';
my $slots = $primary->data_dir . '/pg_amrtree/ssd.slots';
my $intruder = amr_node('intruder', pool => $pool, keep_pool => 1);
$intruder->start;
($ret, $out, $err) = $intruder->psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE x (b box); CREATE INDEX ON x USING amrtree (b)');
like($err, qr/PMEM pool ".*" is not usable: could not open the PMEM pool/, 'a pool in use by another server is refused');
like($err, qr/another server has it open/, '... saying why');
$intruder->stop;
$intruder->append_conf('postgresql.conf', "amrtree.pmem_path = 'pg_amrtree/own.pool'\namrtree.ssd_path = '$slots'\n");
$intruder->start;
($ret, $out, $err) = $intruder->psql('postgres', 'CREATE INDEX ON x USING amrtree (b)');
like($err, qr/the SSD slot file is in use by another server/, 'a slot file in use by another server is refused');
$intruder->stop;
is($primary->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the primary did not notice');

# the primary's slot file in a server of another cluster (primary stopped)
$primary->stop;
$intruder->start;
($ret, $out, $err) = $intruder->psql('postgres', 'CREATE INDEX ON x USING amrtree (b)');
like($err, qr/the SSD slot file belongs to another cluster or pool/, 'a slot file of another cluster is refused');
$intruder->stop;

# truncated, then missing slot file: its leaves are lost to the pool, so
# the file is replaced (a truncated one kept aside), queries answer from the
# table meanwhile, and the index is rebuilt
my $forced = "SET enable_seqscan = off; SET enable_bitmapscan = off; $q";
truncate($slots, (-s $slots) / 2) or die;
my $log_offset = -s $primary->logfile;
$primary->start;
is($primary->safe_psql('postgres', $forced), $expected, 'with a truncated slot file, queries still answer');
ok($primary->log_contains('the SSD slot file .* cannot be used \(the SSD slot file is truncated\); starting a new one', $log_offset),
	'the truncated slot file is replaced, saying why');
ok(amr_wait_for_index_use($primary, 'postgres', $q, 't_b', 120), 'the index is rebuilt');
is($primary->safe_psql('postgres', $forced), $expected, '... and answers');
$primary->stop;
unlink glob("$slots.lost-*");
unlink $slots or die;
$log_offset = -s $primary->logfile;
$primary->start;
is($primary->safe_psql('postgres', $forced), $expected, 'with the slot file missing, queries still answer');
ok(amr_wait_for_index_use($primary, 'postgres', $q, 't_b', 120), 'the index is used again');
is($primary->safe_psql('postgres', "SET enable_seqscan = off; SET enable_bitmapscan = off; $q"), $expected,
	'and everything is back');
is($primary->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and valid');
$primary->stop;
done_testing();
