# Unlogged tables: their amrtree indexes survive a clean restart and are
# emptied after a crash, exactly as PostgreSQL empties the tables.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('unlogged');
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE UNLOGGED TABLE u (id int, b box);
INSERT INTO u SELECT i, box(point(i, 0), point(i + 0.5, 1)) FROM generate_series(1, 5000) i;
CREATE INDEX u_b ON u USING amrtree (b);
CREATE TABLE l (id int, b box);
INSERT INTO l SELECT i, box(point(i, 0), point(i + 0.5, 1)) FROM generate_series(1, 5000) i;
CREATE INDEX l_b ON l USING amrtree (b);
});
my $q = q{SET enable_seqscan = off; SELECT count(*) FROM %s WHERE b && '((100,0),(200,1))'};

$node->restart;
is($node->safe_psql('postgres', sprintf($q, 'u')), '101', 'unlogged index survives a clean restart');
is($node->safe_psql('postgres', q{SELECT amrtree_check('u_b')}), 't', 'and is valid');

$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM u'), '0', 'PostgreSQL emptied the unlogged table after the crash');
is($node->safe_psql('postgres', sprintf($q, 'u')), '0', 'the unlogged index is empty too');
is($node->safe_psql('postgres', q{SELECT entries FROM amrtree_index_stats('u_b')}), '0', 'no entries remain');
is($node->safe_psql('postgres', q{SELECT amrtree_check('u_b')}), 't', 'and it is valid');
is($node->safe_psql('postgres', sprintf($q, 'l')), '101', 'the logged table and its index are untouched');

$node->safe_psql('postgres', q{INSERT INTO u SELECT i, box(point(i, 0), point(i + 0.5, 1)) FROM generate_series(1, 300) i});
is($node->safe_psql('postgres', sprintf($q, 'u')), '101', 'the unlogged index takes new rows after the reset');
is($node->safe_psql('postgres', q{SELECT amrtree_check('u_b')}), 't', 'and stays valid');
$node->stop;
done_testing();
