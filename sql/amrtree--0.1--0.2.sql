/* amrtree--0.1--0.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION amrtree UPDATE TO '0.2'" to load this file. \quit

-- a NULL argument returns NULL instead of acting on OID 0 or a 5 s default
ALTER FUNCTION amrtree_settle(regclass, float8) STRICT;

-- raw leaf contents are for superusers (and whom they GRANT), as pageinspect's
REVOKE ALL ON FUNCTION amrtree_leaf_entries(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION amrtree_leaf_table(regclass) FROM PUBLIC;
