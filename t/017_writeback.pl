# The default pool -- a file in the data directory, written back in the
# background, commits durable through the WAL -- after simulated operating
# system crashes, where what the kernel had not written to the disk is lost:
#
#  1. every pool write since the last checkpoint is lost: background
#     write-back is held off (amrtree.writeback_delay = 1h, so only a
#     checkpoint's fence writes), the file is copied after a CHECKPOINT,
#     inserts, deletes, splits and VACUUM run under two clients, the server
#     stops with -m immediate and the copy is put back;
#  2. torn writes: the same with write-back every 10 ms, and each 512-byte
#     sector of the Leaf Table and leaf slots taken at random from the file
#     at the checkpoint or at the crash.
#
# After each: amrtree_check holds, every strategy on 40 windows returns what
# a sequential scan returns (no committed row lost), an index-only scan
# counts exactly the heap's rows after VACUUM (no phantom row), and KNN
# agrees with a sort.  Then a pool file older than the last checkpoint
# (what a checkpoint slipping between two fences would leave) is refused
# and the index rebuilt, and the pool file is deleted while the server is
# stopped: reads and writes work at once and the index is rebuilt.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Copy;
use IPC::Run;
use Time::HiRes qw(time usleep);
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('wback', pool => undef, conf => q{
wal_level = replica
checkpoint_timeout = 1h
max_wal_size = 4GB
autovacuum = off
amrtree.writeback_delay = 1h
amrtree.scan_interval = 200ms
});
$node->start;
my $pool = $node->data_dir . '/pg_amrtree/pmem.pool';
ok(-f $pool, 'the default pool is a file in the data directory');
like(slurp_file($node->logfile), qr/written back in the background/,
	'the server log says the pool is written back');

$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id serial, b box);
INSERT INTO t (b) SELECT box(point(x, y), point(x + random() * 3, y + random() * 3))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, 20000)) s;
INSERT INTO t (b) SELECT NULL FROM generate_series(1, 20);
CREATE INDEX t_b ON t USING amrtree (b);
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows SELECT i, box(point(x, y), point(x + w, y + w))
  FROM (SELECT i, (i * 137) % 1000 AS x, (i * 311) % 1000 AS y, 1 + (i % 5) * 25 AS w
        FROM generate_series(1, 40) i) s;
});
amr_setup_parity($node);

my $load = $node->basedir . '/load.sql';
open(my $fh, '>', $load) or die;
print $fh q{
\set x random(0, 999)
\set y random(0, 999)
\set r random(1, 10)
BEGIN;
INSERT INTO t (b) SELECT box(point(:x + g, :y), point(:x + g + 1, :y + 1)) FROM generate_series(1, 4) g;
DELETE FROM t WHERE id = (SELECT max(id) FROM t) - 500 * :r;
COMMIT;
};
close $fh;

sub run_load
{
	my ($seconds) = @_;
	my $vacuum_at = time + $seconds / 2;
	my @cmd = ('pgbench', '-n', '-c', '2', '-T', $seconds, '-f', $load,
		'-d', $node->connstr('postgres'));
	my $h = IPC::Run::start(\@cmd, '>', \my $out, '2>', \my $err);
	usleep(($vacuum_at - time) * 1e6) if $vacuum_at > time;
	$node->safe_psql('postgres', 'VACUUM t');
	$h->finish;
	like($out, qr/number of transactions actually processed: [1-9]/, "load: $seconds s of inserts, deletes and a VACUUM");
}

sub pages_written
{
	my $d = $node->safe_psql('postgres', 'SELECT pool FROM amrtree_pool_stats()');
	$d =~ /(\d+) pages written, (\d+) fences/ or die "no write-back counters in: $d";
	return ($1, $2);
}

sub check_all
{
	my ($what) = @_;
	amr_check_index_agrees($node, $what, 't', 't_b', 10, 15);
	$node->safe_psql('postgres', 'VACUUM t');
	my $ios = $node->safe_psql('postgres', q{
SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM t WHERE b && box '((-1e9,-1e9),(1e9,1e9))'});
	my $heap = $node->safe_psql('postgres', 'SELECT count(*) FROM t WHERE b IS NOT NULL');
	is($ios, $heap, "$what: an index-only scan counts the heap's $heap rows");
	like($node->safe_psql('postgres', q{
SET enable_seqscan = off; SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM t WHERE b && box '((-1e9,-1e9),(1e9,1e9))'}),
		qr/Index Only Scan using t_b/, "$what: that count came from the index");
}

# --- 1. every write since the checkpoint is lost
$node->safe_psql('postgres', 'CHECKPOINT');
copy($pool, "$pool.at-checkpoint") or die "copy: $!";
my ($written0, $fences0) = pages_written();
run_load(6);
my ($written1, $fences1) = pages_written();
is($fences1, $fences0, 'no checkpoint fenced during the load');
is($written1, $written0, 'no pool page was written back during the load');
$node->stop('immediate');
copy("$pool.at-checkpoint", $pool) or die "copy: $!";
$node->start;
check_all('pool as at the checkpoint');

# --- 2. torn writes: sectors from the checkpoint's file and the crash's
$node->adjust_conf('postgresql.conf', 'amrtree.writeback_delay', '10ms');
$node->reload;
$node->safe_psql('postgres', 'CHECKPOINT');
copy($pool, "$pool.at-checkpoint") or die "copy: $!";
($written0, $fences0) = pages_written();
run_load(6);
($written1, $fences1) = pages_written();
is($fences1, $fences0, 'no checkpoint fenced during the load');
cmp_ok($written1, '>', $written0, 'pages were written back during the load');
$node->stop('immediate');

my $torn = tear($pool, "$pool.at-checkpoint");
cmp_ok($torn, '>', 0, "$torn pages torn between the two files");
$node->start;
check_all('torn pool');

# Leaf Table and slot pages that differ between the file at the crash and
# at the checkpoint get each 512-byte sector from one of the two at random.
# The header and tree records (written through, synced) stay as they are.
sub tear
{
	my ($now, $then) = @_;
	open(my $a, '+<:raw', $now) or die;
	open(my $b, '<:raw', $then) or die;
	my $lt_offset = (amr_pool_header($now))[1]->{lt_offset};
	my $size = -s $now;
	my $n = 0;
	srand(17);
	for (my $p = int(($lt_offset + 4095) / 4096) * 4096; $p + 4096 <= $size; $p += 4096)
	{
		my ($pa, $pb);
		sysseek($a, $p, 0);
		sysread($a, $pa, 4096);
		sysseek($b, $p, 0);
		sysread($b, $pb, 4096);
		next if $pa eq $pb;
		my $mix = '';
		$mix .= substr(rand() < 0.5 ? $pa : $pb, $_ * 512, 512) for 0 .. 7;
		sysseek($a, $p, 0);
		syswrite($a, $mix);
		$n++;
	}
	close $a;
	close $b;
	return $n;
}

# --- 3. a file older than the checkpoint recovery starts from (what a
# checkpoint that slipped between two fences would leave): detected at
# start, never used, and the index is rebuilt
$node->safe_psql('postgres', 'CHECKPOINT');
copy($pool, "$pool.at-checkpoint") or die "copy: $!";
run_load(2);
$node->safe_psql('postgres', 'CHECKPOINT');
$node->stop('immediate');
copy("$pool.at-checkpoint", $pool) or die "copy: $!";
my $log_at = -s $node->logfile;
$node->start;
like(slurp_file($node->logfile, $log_at), qr/is not complete up to the WAL position recovery starts from/,
	'stale pool: detected at start');
wait_for_index('stale pool');
check_all('stale pool, rebuilt');

sub wait_for_index
{
	my ($what) = @_;
	my $ok = 0;
	for (1 .. 240)
	{
		my $plan = $node->safe_psql('postgres', q{SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM t WHERE b && box '((0,0),(500,500))'});
		if ($plan =~ /t_b/)
		{
			$ok = 1;
			last;
		}
		usleep(500_000);
	}
	ok($ok, "$what: the index is rebuilt and chosen again without REINDEX");
}

# --- 4. the pool file is deleted while the server is stopped
$node->stop;
unlink $pool or die;
unlink "$pool.at-checkpoint";
$node->start;
my $count = $node->safe_psql('postgres', q{SELECT count(*) FROM t WHERE b && box '((0,0),(500,500))'});
my $seq = $node->safe_psql('postgres', q{SET enable_indexscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM t WHERE b && box '((0,0),(500,500))'});
is($count, $seq, 'pool deleted: the first query returns what a sequential scan returns');
$node->safe_psql('postgres', q{INSERT INTO t (b) VALUES (box '((1,1),(2,2))')});
pass('pool deleted: an insert succeeds at once');
wait_for_index('pool deleted');
check_all('rebuilt index');

$node->stop;

# --- 5. wal_level = minimal: an index created in the same transaction as
# its table logs nothing; its pages must reach the file before the commit
my $min = amr_node('wbmin', pool => undef,
	conf => "wal_level = minimal\nmax_wal_senders = 0\namrtree.writeback_delay = 1h\n");
$min->start;
like(slurp_file($min->logfile), qr/written back in the background/,
	'wal_level = minimal: the pool is written back too');
$min->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
BEGIN;
CREATE TABLE m (id serial, b box);
INSERT INTO m (b) SELECT box(point(x, y), point(x + 1, y + 1))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, 5000)) s;
CREATE INDEX m_b ON m USING amrtree (b);
INSERT INTO m (b) SELECT box(point(x, y), point(x + 1, y + 1))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, 3000)) s;
COMMIT;
INSERT INTO m (b) SELECT box(point(x, y), point(x + 1, y + 1))
  FROM (SELECT random() * 1000 AS x, random() * 1000 AS y FROM generate_series(1, 2000)) s;
});
$min->stop('immediate');
$min->start;
is($min->safe_psql('postgres', "SELECT amrtree_check('m_b')"), 't', 'wal_level = minimal, after a crash: amrtree_check');
is($min->safe_psql('postgres', q{SET enable_seqscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM m WHERE b && box '((-1e9,-1e9),(1e9,1e9))'}), '10000',
	'wal_level = minimal, after a crash: the index holds all 10000 rows');
is($min->safe_psql('postgres', q{SET enable_seqscan = off;
SELECT count(*) FROM m WHERE b && box '((100,100),(400,300))'}),
	$min->safe_psql('postgres', q{SET enable_indexscan = off; SET enable_bitmapscan = off;
SELECT count(*) FROM m WHERE b && box '((100,100),(400,300))'}),
	'wal_level = minimal, after a crash: a window equals a sequential scan');
$min->stop;
done_testing();
