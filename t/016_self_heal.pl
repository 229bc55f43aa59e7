# An index whose pool is lost heals itself: the pool is deleted while the
# server is stopped (a reboot that cleared /dev/shm), and from the first
# query on, reads return what a sequential scan returns, writes succeed
# (under a pgbench load that runs through the rebuild), and the index comes
# back -- chosen by the planner, equal to a sequential scan, valid -- with
# no REINDEX by hand.  The same for a second database, which nobody touches,
# and for a wiped SSD slot file (only the indexes with leaves there rebuild).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('heal', conf => "amrtree.ssd_size = 16MB\nautovacuum_naptime = 1s\n");
my $pool = amr_pool_path('heal');
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id serial, b box);
INSERT INTO t (b) SELECT box(point(x, y), point(x + random() * 2, y + random() * 2))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, 40000)) s;
INSERT INTO t (b) SELECT NULL FROM generate_series(1, 50);
CREATE INDEX t_b ON t USING amrtree (b);
CREATE DATABASE other;
});
$node->safe_psql('other', q{
CREATE EXTENSION amrtree;
CREATE TABLE o (b box);
INSERT INTO o SELECT box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 3000) i;
CREATE INDEX o_b ON o USING amrtree (b) WITH (tiering = off);
});

# windows of every size, and the NULLs
my @windows = map { my ($x, $y, $w) = (($_ * 137) % 1000, ($_ * 311) % 1000, 1 + ($_ % 7) * 20);
	"b && box '(($x,$y),(" . ($x + $w) . "," . ($y + $w) . "))'" } 1 .. 30;
push @windows, 'b IS NULL', q{b @> box '((500,500),(500.5,500.5))'};

# index and sequential scan in one snapshot, so that concurrent writes
# cannot make them differ
sub mismatches
{
	my ($db, $table) = @_;
	my $bad = 0;
	for my $w (@windows)
	{
		my $q = "SELECT count(*) || ':' || coalesce(sum(hashtext(b::text)), 0) FROM $table WHERE $w";
		my $out = $node->safe_psql($db, qq{
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL enable_seqscan = off;
$q;
SET LOCAL enable_seqscan = on; SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off; SET LOCAL enable_indexonlyscan = off;
$q;
COMMIT;});
		my @r = split /\n/, $out;
		$bad++ if @r != 2 || $r[0] ne $r[1];
	}
	return $bad;
}

sub uses_index
{
	my ($db, $table, $index) = @_;
	my $plan = $node->safe_psql($db,
		"SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT count(*) FROM $table WHERE b && box '((1,1),(50,50))'");
	return $plan =~ /\Q$index\E/;
}

# Wait up to $secs until the planner uses every one of the (db, table,
# index) triples again; whether it did.
sub used_again_within
{
	my ($secs, @indexes) = @_;
	my $deadline = time + $secs;
	while (time < $deadline)
	{
		return 1 unless grep { !uses_index(@$_) } @indexes;
		usleep(300_000);
	}
	return 0;
}

ok(uses_index('postgres', 't', 't_b'), 'the index is used before the pool is lost');
is(mismatches('postgres', 't'), 0, 'and agrees with a sequential scan');

# --- the pool is lost while the server is stopped
$node->stop;
ok(-e $pool, 'the pool file existed');
unlink $pool or die "unlink $pool: $!";
my $log_offset = -s $node->logfile;
$node->start;

# writes from the first moment, through the rebuild
my $ins = $node->basedir . '/ins.sql';
PostgreSQL::Test::Utils::append_to_file($ins, q{
\set x random(0, 990)
\set y random(0, 990)
INSERT INTO t (b) VALUES (box(point(:x, :y), point(:x + 1, :y + 1)));
DELETE FROM t WHERE id = (SELECT max(id) FROM t WHERE id % 97 = 0);
});
my ($pgb_out, $pgb_err) = ('', '');
my $pgbench = IPC::Run::start(
	[ 'pgbench', '-n', '-c', '2', '-T', '8', '-f', $ins, '-d', $node->connstr('postgres') ],
	'>', \$pgb_out, '2>', \$pgb_err);

is(mismatches('postgres', 't'), 0, 'right after the restart, queries return what a sequential scan returns');
my ($ret, $out, $err) = $node->psql('postgres', q{INSERT INTO t (b) VALUES (box '((2,2),(3,3))') RETURNING 1});
is($ret, 0, 'and an INSERT succeeds') or diag($err);

# the index comes back by itself
ok(used_again_within(120, [ 'postgres', 't', 't_b' ], [ 'other', 'o', 'o_b' ]),
	'both indexes are chosen by the planner again, with no REINDEX by hand');
$pgbench->finish;
is($?, 0, 'the pgbench load through the rebuild succeeded') or diag($pgb_err);
like($pgb_out, qr/number of failed transactions: 0/, '... with no failed transaction');

ok($node->log_contains('amrtree: rebuilding index "public.t_b"', $log_offset), 'the server log says it rebuilt t_b');
ok($node->log_contains('amrtree: rebuilt index "public.o_b"', $log_offset),
	'and o_b in a database nobody touched');
is(mismatches('postgres', 't'), 0, 'the rebuilt index agrees with a sequential scan (rows written during the rebuild included)');
is(mismatches('other', 'o'), 0, 'so does the other database\'s');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'the rebuilt index is valid');
is($node->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('t_b')}), 'ok', 'its status is ok');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname LIKE 't_b_ccnew%'}),
	'0', 'no leftover of the concurrent rebuild');

# --- and it survives a restart as any index does
$node->restart;
is(mismatches('postgres', 't'), 0, 'after a restart it still agrees with a sequential scan');
ok(uses_index('postgres', 't', 't_b'), 'and is used');

# --- the SSD slot file is wiped while the server is stopped
$node->safe_psql('postgres', q{ALTER INDEX t_b SET (pmem_budget = '10%'); SELECT amrtree_settle('t_b', 0)});
ok($node->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}) > 0,
	'leaves of t_b are on the SSD tier');
is($node->safe_psql('other', q{SELECT count(*) FROM amrtree_tier_stats('o_b') WHERE tier = 'ssd' AND leaves > 0}),
	'0', 'o_b has none there');
$node->stop;
my $slots = $node->data_dir . '/pg_amrtree/ssd.slots';
my $size = -s $slots;
ok($size > 0, 'the slot file exists');
open(my $fh, '+<', $slots) or die "open $slots: $!";
binmode $fh;
print $fh "\0" x 65536;    # header and first slots zeroed
close $fh;
$log_offset = -s $node->logfile;
$node->start;
is(mismatches('postgres', 't'), 0, 'with the slot file wiped, queries still return what a sequential scan returns');
($ret, $out, $err) = $node->psql('postgres', q{INSERT INTO t (b) VALUES (box '((4,4),(5,5))')});
is($ret, 0, 'and an INSERT succeeds') or diag($err);
ok(uses_index('other', 'o', 'o_b'), 'an index with no leaf on the SSD tier is untouched');
is($node->safe_psql('other', q{SELECT status FROM amrtree_index_stats('o_b')}), 'ok', '... its status is ok');
ok(used_again_within(120, [ 'postgres', 't', 't_b' ]),
	't_b is chosen by the planner again, with no REINDEX by hand');
ok($node->log_contains('cannot be used .*starting a new one', $log_offset), 'the log says the slot file was replaced');
ok(scalar(my @aside = glob("$slots.lost-*")), 'the wiped file was kept aside');
is(mismatches('postgres', 't'), 0, 'the rebuilt index agrees with a sequential scan');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and is valid');
is($node->safe_psql('other', q{SELECT amrtree_check('o_b')}), 't', 'o_b too');
ok(!$node->log_contains('rebuilding index "public.o_b"', $log_offset), 'and it was not rebuilt');

# --- a rebuild that fails leaves nothing behind.  With rebuilds off, the
# pool is lost again and a writer's transaction stays open; rebuilds on,
# REINDEX CONCURRENTLY creates its copy and waits for that writer; it is
# cancelled there, and the worker drops the invalid copy (waiting for the
# writer as DROP INDEX CONCURRENTLY does); a later run rebuilds the index.
$node->stop;
$node->append_conf('postgresql.conf', "amrtree.auto_rebuild = off\n");
unlink $pool or die "unlink $pool: $!";
$log_offset = -s $node->logfile;
$node->start;
my $writer = $node->background_psql('postgres');
$writer->query_safe(q{BEGIN; INSERT INTO t (b) VALUES (box '((7,7),(8,8))')});
$node->safe_psql('postgres', q{ALTER SYSTEM SET amrtree.auto_rebuild = on; SELECT pg_reload_conf()});
my $rebuilder = q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'amrtree rebuild'
  AND wait_event_type = 'Lock' AND query = '%s'};
ok($node->poll_query_until('postgres', sprintf("SELECT EXISTS (%s)",
	sprintf($rebuilder, 'REINDEX INDEX CONCURRENTLY public.t_b'))),
	'the rebuild of t_b waits for the open writer');
is($node->safe_psql('postgres', q{SELECT indisvalid FROM pg_index WHERE indexrelid = 'public.t_b_ccnew'::regclass}),
	'f', 'its copy t_b_ccnew exists, invalid');
$node->safe_psql('postgres', sprintf('SELECT pg_cancel_backend(pid) FROM (%s) w',
	sprintf($rebuilder, 'REINDEX INDEX CONCURRENTLY public.t_b')));
ok($node->poll_query_until('postgres', sprintf("SELECT EXISTS (%s)",
	sprintf($rebuilder, 'DROP INDEX CONCURRENTLY public.t_b_ccnew'))),
	'cancelled, the worker drops the copy, waiting for the writer');
$writer->query_safe('COMMIT');
$writer->quit;
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM pg_class WHERE relname LIKE 't_b_cc%'}),
	'no leftover of the failed rebuild');
ok($node->log_contains('could not rebuild index "public.t_b"', $log_offset), 'the log says the rebuild failed');
ok($node->log_contains('dropped index "public.t_b_ccnew", which a failed rebuild left invalid', $log_offset),
	'and that the worker dropped its copy');
ok(used_again_within(150, [ 'postgres', 't', 't_b' ]),
	'a later run rebuilds t_b (after the wait that follows a failure)');
is(mismatches('postgres', 't'), 0, 'the rebuilt index agrees with a sequential scan');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and is valid');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname LIKE 't_b_cc%'}),
	'0', 'no leftover after the second run either');

# --- a rebuild stopped outright (its worker terminated, as a shutdown
# does) cannot drop its copy: the next run finds the copy by its name and
# drops it before it rebuilds
$node->safe_psql('postgres', q{ALTER SYSTEM SET amrtree.auto_rebuild = off});
$node->stop;
unlink $pool or die "unlink $pool: $!";
$log_offset = -s $node->logfile;
$node->start;
$writer = $node->background_psql('postgres');
$writer->query_safe(q{BEGIN; INSERT INTO t (b) VALUES (box '((9,9),(10,10))')});
$node->safe_psql('postgres', q{ALTER SYSTEM SET amrtree.auto_rebuild = on; SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres', sprintf("SELECT EXISTS (%s)",
	sprintf($rebuilder, 'REINDEX INDEX CONCURRENTLY public.t_b'))),
	'the rebuild of t_b waits for the open writer again');
$node->safe_psql('postgres', sprintf('SELECT pg_terminate_backend(pid) FROM (%s) w',
	sprintf($rebuilder, 'REINDEX INDEX CONCURRENTLY public.t_b')));
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'amrtree rebuild' AND query LIKE '%t_b%'}),
	'its worker is terminated');
is($node->safe_psql('postgres', q{SELECT indisvalid FROM pg_index WHERE indexrelid = 'public.t_b_ccnew'::regclass}),
	'f', 'and has left its copy t_b_ccnew, invalid');
$writer->query_safe('COMMIT');
$writer->quit;
ok(used_again_within(150, [ 'postgres', 't', 't_b' ]), 'the next run rebuilds t_b');
ok($node->log_contains('dropped index "public.t_b_ccnew", which a failed rebuild left invalid', $log_offset),
	'after dropping the copy the terminated one left');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname LIKE 't_b_cc%'}),
	'0', 'no leftover remains');
is(mismatches('postgres', 't'), 0, 'the rebuilt index agrees with a sequential scan');
$node->stop;
done_testing();
