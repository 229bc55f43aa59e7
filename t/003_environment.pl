# The environment amrtree depends on, and what happens when it is wrong:
# no shared_preload_libraries, a pool from another cluster or of another
# format version (set aside, a new one made), one that another server holds
# (refused) or held a moment longer by one on its way out (waited for),
# a wiped pool with amrtree.auto_rebuild = off (queries skip
# the index, writes succeed, the hint says REINDEX), a pool on an ordinary disk file, settings PostgreSQL rejects,
# directories that do not exist, an SSD tier being switched off, a slot
# file the server may not open (refused, left alone) or cannot re-create
# (its indexes still rebuilt at the next start), and
# io_uring refused by a seccomp filter.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Copy;
use Fcntl qw(:flock);
use POSIX ();
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

# --- a pool from another cluster: kept under another name, a new pool is
# made in its place (the indexes of the old one would heal)
my $other = amr_node('other');
my $main_pool = amr_pool_path('main');
$other->append_conf('postgresql.conf', "amrtree.pmem_path = '$main_pool'\n");
$other->start;
$other->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box)');
($ret, $out, $err) = $other->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
is($ret, 0, 'a foreign pool does not stop amrtree') or diag($err);
ok($other->log_contains(qr/the PMEM pool "\Q$main_pool\E" cannot be used \(it belongs to another cluster\); it was renamed to/),
	'the log says the foreign pool was set aside');
ok($other->log_contains('The pool belongs to the cluster with system identifier \d+, this cluster\'s is \d+'),
	'... naming both system identifiers');
my @aside = glob("$main_pool.unusable-*");
is(scalar(@aside), 1, 'the foreign pool is kept under another name');
$other->stop;
unlink @aside;

# --- another format version (patch a copy of the header)
my $patched = amr_pool_path('patched');
copy($main_pool, $patched) or die "copy: $!";
{
	my ($at) = amr_pool_header($patched);
	open my $fh, '+<:raw', $patched or die;
	seek $fh, $at + 8, 0;
	print $fh pack('V', 99);
	close $fh;
}
my $vers = amr_node('version', pool => $patched, keep_pool => 1);
$vers->start;
$vers->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box)');
($ret, $out, $err) = $vers->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
is($ret, 0, 'a pool of another format version does not stop amrtree') or diag($err);
ok($vers->log_contains('cannot be used \(it has an incompatible format\)'), 'the log says why it was set aside');
ok($vers->log_contains('format version 99'), '... naming the version');
$vers->stop;
unlink $patched, glob("$patched.unusable-*");

# --- a pool another server holds is never set aside
my $holder = amr_node('holder', pool => $main_pool, keep_pool => 1);
$other->start;
$holder->start;
($ret, $out, $err) = $holder->psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box); CREATE INDEX ON t USING amrtree (b)');
like($err, qr/could not open the PMEM pool/, 'a pool in use by another server is refused');
ok(!glob("$main_pool.unusable-*"), 'and left where it is');
$holder->stop;
$other->stop;

# --- a wiped pool with amrtree.auto_rebuild = off: queries skip the index
# (no wrong rows, no errors), writes succeed, and the hint says REINDEX
$node->append_conf('postgresql.conf', "amrtree.auto_rebuild = off\n");
$node->start;
$node->stop;
unlink $main_pool;
$node->start;
my $q_idx = q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'};
like($node->safe_psql('postgres', "SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'"),
	qr/Seq Scan/, 'the planner skips an index whose tree is gone, even with enable_seqscan = off');
is($node->safe_psql('postgres', $q_idx), '12', '... and the query answers from the table');
$node->safe_psql('postgres', q{INSERT INTO t (b) VALUES ('((15,15),(15.5,15.5))')});
is($node->safe_psql('postgres', $q_idx), '13', 'inserts succeed meanwhile');
is($node->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('t_b')}),
	'no tree (REINDEX)', 'amrtree_index_stats says the index needs a REINDEX');
($ret, $out, $err) = $node->psql('postgres', q{SELECT amrtree_check('t_b')});
like($err, qr/amrtree index "t_b" has no tree in the PMEM pool/, 'checking the index names the missing tree');
like($err, qr/HINT:  Rebuild it: REINDEX INDEX public\.t_b;/, '... with the REINDEX hint');
sleep 2;
ok(!$node->log_contains('rebuilding index'), 'nothing is rebuilt with amrtree.auto_rebuild = off');
$node->safe_psql('postgres', 'REINDEX INDEX t_b');
like($node->safe_psql('postgres', "SET enable_seqscan = off; EXPLAIN (COSTS OFF) SELECT count(*) FROM t WHERE b && '((10,10),(20,20))'"),
	qr/t_b/, 'after REINDEX the planner uses the index again');
is($node->safe_psql('postgres', $q_idx), '13', '... and it answers with every row');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and it is valid');
is($node->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('t_b')}), 'ok', 'status ok');
$node->stop;

# --- a pool whose lock a process on its way out still holds (a server
# stopped a moment before, still tearing down its shared memory, as
# pg_ctl restart meets it): the next start waits for the lock rather than
# refusing the pool as another server's
{
	open(my $fh, '<', $main_pool) or die "open $main_pool: $!";
	flock($fh, LOCK_EX) or die "flock $main_pool: $!";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		# the lock belongs to the open file, which the child shares
		sleep 3;
		POSIX::_exit(0);
	}
	close($fh);
	$node->start;
	waitpid($pid, 0);
	is($node->safe_psql('postgres', q{SELECT status FROM amrtree_index_stats('t_b')}), 'ok',
		'a pool whose lock an exiting process held a moment longer is used');
	is($node->safe_psql('postgres', $q_idx), '13', '... and its index answers');
	ok($node->log_contains('waiting for another process to release'), 'the log says the server waited');
	ok($node->log_contains(qr/"\Q$main_pool\E" was released after \d+ ms/), '... and for how long');
	$node->stop;
}

# --- the default location: a disk file in the data directory, written
# back (docs/design.md, "Write-back pools"; t/017 crashes it)
my $disk = amr_node('disk', pool => undef, pmem_size => '64MB');
$disk->start;
ok($disk->log_contains('pg_amrtree/pmem.pool.*a disk file, written back in the background'),
	'the default pool lives in the data directory and is written back');
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

# amrtree.writeback = off: the same file, every change synced with msync
$disk->append_conf('postgresql.conf', "amrtree.writeback = off\n");
my $log_at = -s $disk->logfile;
$disk->start;
like(slurp_file($disk->logfile, $log_at), qr/pg_amrtree\/pmem.pool.*a disk file \(persisted with msync\)/,
	'amrtree.writeback = off: the pool is persisted with msync');
$disk->safe_psql('postgres', q{INSERT INTO t SELECT i, box(point(i, 4), point(i + 0.5, 5)) FROM generate_series(1, 500) i});
$disk->stop('immediate');
$disk->start;
is($disk->safe_psql('postgres', q{SET enable_seqscan = off; SELECT count(*) FROM t WHERE b && '((100,0),(200,5))'}),
	'303', 'and its changes survive a crash');
is($disk->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'valid');
$disk->stop;

# --- a server-start setting PostgreSQL rejects is not silently replaced
# by its default: the pool stays closed and every use names the setting
my $bad = amr_node('badsize', conf => "amrtree.pmem_size = '1MB'\n");
$bad->start;
ok($bad->log_contains('amrtree.pmem_size'), 'PostgreSQL warns about the value at startup');
$bad->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box)');
($ret, $out, $err) = $bad->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
like($err, qr/is not usable: the setting amrtree\.pmem_size = '1MB' is not valid/,
	'amrtree.pmem_size = 1MB: the pool is not opened with another size');
like($err, qr/DETAIL:  1 MB is outside the valid range for amrtree\.pmem_size \(32 MB \.\. 4194304 MB\)/,
	'... saying why');
ok(!-e amr_pool_path('badsize'), 'no pool was created');
$bad->stop;
$bad->adjust_conf('postgresql.conf', 'amrtree.pmem_size', "'64MB'");
$bad->append_conf('postgresql.conf', "amrtree.dram_size = 'lots'\n");
$bad->start;
($ret, $out, $err) = $bad->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
like($err, qr/the setting amrtree\.dram_size = 'lots' is not valid/, 'an unparsable size is named too');
$bad->stop;
$bad->adjust_conf('postgresql.conf', 'amrtree.dram_size', "'8MB'");
$bad->start;
$bad->safe_psql('postgres', 'CREATE INDEX t_b ON t USING amrtree (b)');
is($bad->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'with the settings fixed, it works');
$bad->stop;

# --- a slot file whose directory does not exist is not created there: a
# typo in amrtree.ssd_path must not put leaves on some other disk
my $typo_dir = PostgreSQL::Test::Utils::tempdir() . '/no/such/dir';
my $typo = amr_node('typo', conf => "amrtree.ssd_path = '$typo_dir/ssd.slots'\n");
$typo->start;
$typo->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE TABLE t (b box)');
($ret, $out, $err) = $typo->psql('postgres', 'CREATE INDEX ON t USING amrtree (b)');
like($err, qr/the directory of amrtree\.ssd_path does not exist/, 'a missing slot file directory is an error');
like($err, qr/HINT:  Create it, writable by the server, or correct amrtree\.ssd_path/, '... with a hint');
ok(!-d $typo_dir, 'and the directory was not created');
$typo->stop;

# --- amrtree.ssd_size = 0 turns the SSD tier off once no leaf is on it
# (a table whose index keeps 30 % of its leaves on PMEM, the rest on SSD,
# used again below)
my $ssd_table = q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int, b box);
INSERT INTO t SELECT i, box(point(i, 0), point(i + 0.5, 1)) FROM generate_series(1, 20000) i;
CREATE INDEX t_b ON t USING amrtree (b) WITH (pmem_budget = '30%');
SELECT amrtree_settle('t_b', 0);};
my $ssd = amr_node('ssdoff', conf => "amrtree.ssd_size = 16MB\n");
$ssd->start;
$ssd->safe_psql('postgres', $ssd_table);
my $slots = $ssd->data_dir . '/pg_amrtree/ssd.slots';
my $q = q{SELECT count(*) FROM t WHERE b && '((100,0),(200,1))'};
my $expected = $ssd->safe_psql('postgres', "SET enable_indexscan = off; SET enable_bitmapscan = off; $q");
ok($ssd->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}) > 0,
	'leaves were demoted to the SSD tier');
$ssd->stop;
$ssd->adjust_conf('postgresql.conf', 'amrtree.ssd_size', '0');
$ssd->start;
ok($ssd->log_contains('amrtree\.ssd_size = 0, but \d+ leaves are on the SSD tier; it stays enabled'),
	'ssd_size = 0 with leaves on SSD keeps the tier, saying why');
is($ssd->safe_psql('postgres', "SET enable_seqscan = off; $q"), $expected, 'and every row stays reachable');
$ssd->safe_psql('postgres', q{ALTER INDEX t_b SET (tiering = off); SELECT amrtree_settle('t_b', 0)});
is($ssd->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}), '0',
	'with tiering off the leaves come back to PMEM');
$ssd->restart;
ok($ssd->log_contains('no leaf is on the SSD tier; no longer using slot file'), 'the next start drops the tier');
is($ssd->safe_psql('postgres', 'SELECT ssd_slots FROM amrtree_pool_stats()'), '0', 'there is no SSD tier');
unlink $slots;
$ssd->restart;
is($ssd->safe_psql('postgres', "SET enable_seqscan = off; $q"), $expected, 'removing the unused slot file is harmless');
is($ssd->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and the index is valid');
# and back on: a new slot file, and the tier works again
$ssd->stop;
$ssd->adjust_conf('postgresql.conf', 'amrtree.ssd_size', '16MB');
$ssd->start;
$ssd->safe_psql('postgres', q{ALTER INDEX t_b SET (tiering = on); SELECT amrtree_settle('t_b', 0)});
ok($ssd->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}) > 0,
	'turned back on, the SSD tier takes leaves again');
is($ssd->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and the index is valid');
$ssd->stop;

# --- a slot file the server may not open is the operator's to fix, not a
# lost file: it was taken for a foreign one, renamed to .lost-*, and the
# indexes with leaves in it rebuilt
my $forced = "SET enable_seqscan = off; SET enable_bitmapscan = off; $q";
my $slots_size = -s $slots;
chmod 0444, $slots or die;
my $log_offset = -s $ssd->logfile;
$ssd->start;
($ret, $out, $err) = $ssd->psql('postgres', q{SELECT amrtree_check('t_b')});
like($err, qr/is not usable: could not open the SSD slot file/, 'a slot file without write permission is refused');
like($err, qr/DETAIL:  .*Permission denied/, '... saying why');
my @lost = glob("$slots.lost-*");
ok(-s $slots == $slots_size && !@lost, 'and left where and as it is');
$ssd->stop;
chmod 0600, $slots or die;
$ssd->start;
is($ssd->safe_psql('postgres', $forced), $expected, 'with the permissions fixed, the index answers');
ok(!$ssd->log_contains('starting a new one|are rebuilt', $log_offset), 'from the same leaves, nothing rebuilt');
$ssd->stop;

# --- the slot file is missing, and the start that replaces it cannot create
# the new one: the next start creates it, but the index that had leaves in
# the lost file must still be rebuilt -- it was served from the empty file
my $slot_dir = $ssd->data_dir . '/pg_amrtree';
unlink $slots or die;
chmod 0555, $slot_dir or die;
$log_offset = -s $ssd->logfile;
$ssd->start;
($ret, $out, $err) = $ssd->psql('postgres', q{SELECT amrtree_check('t_b')});
like($err, qr/is not usable: could not create the SSD slot file/, 'a slot file that cannot be created is an error');
like($err, qr/DETAIL:  creating .* failed: Permission denied/, '... saying why');
$ssd->stop;
chmod 0700, $slot_dir or die;
$ssd->start;
($ret, $out, $err) = $ssd->psql('postgres', $forced);
is($out, $expected, 'with the new file created at the next start, queries answer');
ok(amr_wait_for_index_use($ssd, 'postgres', $q, 't_b', 60)
	  && $ssd->log_contains('rebuilt index "public.t_b"', $log_offset), 'the index is rebuilt');
is($ssd->safe_psql('postgres', $forced), $expected, '... and answers');
is($ssd->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', '... and is valid');
$ssd->stop;

# --- io_uring not allowed, as under Docker's default seccomp profile (since
# 25.0) or kernel.io_uring_disabled: every read of an SSD leaf failed with
# "Operation not permitted".  Now the postmaster finds out at start, says
# so, and the SSD tier is read and written with pread/pwrite.  The server
# is started under a seccomp filter that makes io_uring_setup fail with
# EPERM (x86_64 numbers).
SKIP:
{
	skip 'the seccomp filter is written for x86_64', 6 unless (POSIX::uname())[4] eq 'x86_64';
	my $nouring = amr_node('nouring', conf => "amrtree.ssd_size = 16MB\namrtree.ssd_cache_size = 0\n");
	# ld [nr]; jeq #425 (io_uring_setup); ret ERRNO(EPERM); ret ALLOW
	my $filter_exec = q{
		my $filter = pack('(SCCL)4', 0x20, 0, 0, 0, 0x15, 0, 1, 425,
			0x06, 0, 0, 0x00050001, 0x06, 0, 0, 0x7fff0000);
		my $prog = pack('S x6 P', 4, $filter);
		syscall(157, 38, 1, 0, 0, 0) == 0 or die "PR_SET_NO_NEW_PRIVS: $!";
		syscall(157, 22, 2, $prog) == 0 or die "PR_SET_SECCOMP: $!";
		exec @ARGV or die "exec: $!";
	};
	{
		local %ENV = $nouring->_get_env(PGAPPNAME => undef);
		is(PostgreSQL::Test::Utils::system_log($^X, '-e', $filter_exec, 'pg_ctl', '-w',
				'-D', $nouring->data_dir, '-l', $nouring->logfile, '-o', '--cluster-name=nouring', 'start'),
			0, 'the server starts under a filter that refuses io_uring');
		$nouring->_update_pid(1);
	}
	ok($nouring->log_contains('amrtree: io_uring is not available, so the SSD tier is read and written with pread and pwrite'),
		'the postmaster says io_uring is not available');
	is($nouring->safe_psql('postgres', q{SELECT setting || ' ' || source FROM pg_settings WHERE name = 'amrtree.io_method'}),
		'sync override', 'and amrtree.io_method shows what is used');
	$nouring->safe_psql('postgres', $ssd_table);
	ok($nouring->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}) > 0,
		'leaves were written to the SSD tier');
	my ($with, $without) = amr_with_and_without_index($nouring, 'postgres',
		q{SELECT count(*) || ' ' || sum(id) FROM t WHERE b && '((100,0),(9000,1))'});
	is($with, $without, 'and are read back from it: the index answers as a sequential scan');
	is($nouring->safe_psql('postgres', q{SELECT amrtree_check('t_b')}), 't', 'and the index is valid');
	$nouring->stop;
}

done_testing();
