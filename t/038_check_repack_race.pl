# amrtree_check's pool-wide part against the first uses after a crash.
#
# After a crash restart with WAL to replay, every tree's inner nodes are
# packed at its first use (amr_tree_pack_if_stale).  The pool-wide part of
# amrtree_check counts the allocated inner nodes against the trees' counts
# under the publish lock in exclusive mode; a repack that did not take that
# lock freed and allocated nodes under it, and the check reported a healthy
# index as corrupted ("N inner nodes are allocated but the trees hold M").
# Found by a randomized fuzzer that checks every index after each crash
# while its other sessions go on.  Here two clients call amrtree_check on a
# small index in a loop while three others make the first use of thirty
# larger ones, after each of five crash restarts: no check may fail.
# Without the publish lock in the repack, three runs out of three failed,
# in three to five of the rounds each (the race is a matter of timing).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $ntables = 30;
my $node = amr_node('checkrace', conf => "max_connections = 30\nautovacuum = off\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');
for my $i (0 .. $ntables - 1)
{
	$node->safe_psql('postgres', qq{
CREATE TABLE t$i AS
SELECT box(point(random() * 1000, random() * 1000), point(random() * 1000 + 1, random() * 1000 + 1)) AS b
FROM generate_series(1, 20000);
CREATE INDEX t${i}_b ON t$i USING amrtree (b);
});
}
$node->safe_psql('postgres', q{
CREATE TABLE small (b box);
INSERT INTO small VALUES ('(1,1),(2,2)');
CREATE INDEX small_b ON small USING amrtree (b);
-- the first use of every index, in an order of its own per client
CREATE FUNCTION use_all(client int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE i int;
BEGIN
  SET LOCAL enable_seqscan = off;
  FOR i IN 0..29 LOOP
    EXECUTE format('SELECT count(*) FROM t%s WHERE b && ''(1,1),(5,5)''::box', (i + client * 10) % 30);
  END LOOP;
END $$;
});

my $dir = PostgreSQL::Test::Utils::tempdir();
open my $fh, '>', "$dir/check.sql" or die;
print $fh "SELECT amrtree_check('small_b');\n";
close $fh;
open $fh, '>', "$dir/use.sql" or die;
print $fh "SELECT use_all(:client_id);\n";
close $fh;

for my $round (1 .. 5)
{
	# WAL to replay for every tree, so that each is packed at its first use
	$node->safe_psql('postgres', q{
DO $$ BEGIN FOR i IN 0..29 LOOP
  EXECUTE format('INSERT INTO t%s VALUES (''(3,3),(4,4)'')', i);
END LOOP; END $$;
});
	$node->stop('immediate');
	$node->start;
	# the small index's own first use, before the race
	$node->safe_psql('postgres', q{SELECT amrtree_check('small_b')});

	my ($out, $err) = ('', '');
	my $checks = IPC::Run::start(
		[
			'pgbench', '-n', '-c', '2', '-j', '2', '-T', '4', '-f', "$dir/check.sql",
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'>', \$out, '2>', \$err);
	my ($uout, $uerr) = ('', '');
	my $users = IPC::Run::run(
		[
			'pgbench', '-n', '-c', '3', '-j', '3', '-t', '1', '-f', "$dir/use.sql",
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'>', \$uout, '2>', \$uerr);
	my $checks_ok = $checks->finish;
	ok($users, "round $round: the first uses succeeded") or diag $uerr;
	ok($checks_ok && $err !~ /corrupted/,
		"round $round: amrtree_check found nothing while the trees were packed")
	  or diag $err;
	is($node->safe_psql('postgres', q{SELECT bool_and(amrtree_check(c.oid))
		FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'amrtree' AND c.relkind = 'i'}),
		't', "round $round: every index checks out afterwards");
}

$node->stop;
done_testing();
