/*-------------------------------------------------------------------------
 *
 * amr_format.h
 *		Persistent formats: the pool header, the tree directory, the Leaf
 *		Table, and the leaf image shared by the PMEM and SSD tiers.
 *
 * Everything here is position independent (offsets, never pointers) and
 * little-endian x86-64 layout.  Changing any of it means bumping
 * AMR_FORMAT_VERSION; a pool of another version is refused at startup.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_FORMAT_H
#define AMR_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "amr_geom.h"

#define AMR_POOL_LAYOUT			"amrtree"
#define AMR_POOL_MAGIC			UINT64_C(0x3145455254524d41)	/* "AMRTREE1" */
#define AMR_FORMAT_VERSION		3	/* 3: the WAL extent (a version 2 pool is
									 * upgraded in place at open) */

/* Leaves occupy fixed slots of this size on both tiers (O_DIRECT aligned). */
#define AMR_SLOT_SIZE			4096

/* Capacity of the tree directory; a pool serves at most this many indexes. */
#define AMR_MAX_TREES			4096

/*
 * The pool header is libpmemobj's root object.  It is written once, when the
 * pool is created, and persisted with "initialized" stored last, so a pool
 * whose creation was interrupted is recognisably empty.
 */
typedef struct AmrPoolHeader
{
	uint64_t	magic;
	uint32_t	format_version;
	uint32_t	slot_size;
	uint64_t	system_identifier;	/* pg_control's; a foreign pool is refused */
	uint64_t	pool_id;		/* random; recorded in every metapage */
	uint64_t	created_at;		/* seconds since the Unix epoch */
	uint64_t	pmem_nslots;	/* leaf slots in this pool */
	uint64_t	lt_capacity;	/* Leaf Table entries (leaf ids) */
	uint32_t	max_trees;
	uint32_t	reserved0;
	uint64_t	slots_offset;	/* byte offsets from the start of the pool */
	uint64_t	lt_offset;
	uint64_t	trees_offset;
	uint64_t	ssd_file_id;	/* identity of the SSD slot file this pool's
								 * Leaf Table references; 0 before first use */
	uint64_t	prune_horizon;	/* WAL position entries are being pruned to
								 * after a crash, 0 if none: a crash during
								 * the pruning resumes it (amr_reconcile.c) */
	uint64_t	history_reset;	/* nonzero: WAL replay could not use the pool
								 * at all; every tree is stale */
	uint64_t	writeback;		/* AMR_WB_*: how the file may lag the DRAM
								 * copy of a write-back pool (amr_writeback.c) */
	uint64_t	fenced_redo;	/* the file holds every change whose WAL
								 * record lies before this */
	uint64_t	boot;			/* AMR_WB_RECOVERY: digest of the boot that
								 * wrote without syncing */
	uint64_t	initialized;	/* AMR_POOL_MAGIC once everything above is */

	/*
	 * Version 3: where in the WAL this pool's contents come from
	 * (amr_lineage.c).  No change in the pool comes from a record that ends
	 * beyond wal_extent on the history of timeline wal_extent_tli, except the
	 * changes of a crashed primary whose records never became durable.
	 * check_tli/check_extent: the extent a start found and has not yet seen
	 * its WAL reach (0: nothing pending).
	 */
	uint32_t	wal_extent_tli;
	uint32_t	check_tli;
	uint64_t	wal_extent;
	uint64_t	check_extent;
} AmrPoolHeader;

/* The header of a version 2 pool ended with "initialized". */
#define AMR_POOL_HEADER_V2_SIZE	offsetof(AmrPoolHeader, wal_extent_tli)

/* AmrPoolHeader.writeback */
#define AMR_WB_COMPLETE		0	/* the file holds every change */
#define AMR_WB_FENCED		1	/* written back; complete before fenced_redo */
#define AMR_WB_RECOVERY		2	/* replay wrote without syncing since
								 * fenced_redo, during boot */
#define AMR_WB_STOPPED		3	/* replay stopped cleanly and synced: complete
								 * before fenced_redo (older versions never
								 * wrote it, so their files keep the same-boot
								 * trust of AMR_WB_RECOVERY) */

/* Tree directory: one record per index, keyed by its storage identity. */
typedef enum AmrTreeState
{
	AMR_TREE_FREE = 0,			/* record unused */
	AMR_TREE_BUILDING = 1,		/* created by a transaction not yet known to
								 * have committed */
	AMR_TREE_VALID = 2,			/* creating transaction committed */
	AMR_TREE_DROPPED = 3		/* dropping transaction committed; leaves are
								 * being (or will be) reclaimed */
} AmrTreeState;

#define AMR_TREE_FLAG_UNLOGGED	0x0001
#define AMR_TREE_FLAG_TEMP		0x0002	/* index of a temporary table: owned
										 * by backend_id, gone at restart */
#define AMR_TREE_FLAG_BROKEN	0x0004	/* WAL replay could not follow the
										 * primary for this tree (the server
										 * log says why): it must be rebuilt */
#define AMR_TREE_FLAG_RESYNC_OPEN 0x0008	/* WAL replay has applied some,
											 * not all, of the records of one
											 * resync of this tree
											 * (amr_walredo.c): scans must not
											 * use it */

typedef struct AmrTreeRecord
{
	uint32_t	state;			/* AmrTreeState; 4-byte store is the commit */
	uint32_t	flags;
	uint32_t	db_oid;
	uint32_t	spc_oid;
	uint32_t	relfilenode;
	uint32_t	index_oid;		/* informational and for supersede checks */
	uint32_t	create_xid;		/* resolves BUILDING after a crash */
	uint32_t	generation;		/* bumped on every reuse of this record */
	uint64_t	create_lsn;
	/* placement settings, mirrored from the reloptions for the tier manager */
	uint32_t	budget_kind;	/* AmrBudgetKind */
	uint32_t	tiering_off;	/* reloption tiering = off */
	double		budget_value;	/* fraction of leaf bytes, or bytes */
	int32_t		backend_id;		/* AMR_TREE_FLAG_TEMP: the owning backend
								 * (temporary relfilenodes are per backend) */
	uint32_t	reserved;
} AmrTreeRecord;

typedef enum AmrBudgetKind
{
	AMR_BUDGET_UNLIMITED = 0,
	AMR_BUDGET_FRACTION = 1,	/* of the index's leaf bytes */
	AMR_BUDGET_BYTES = 2
} AmrBudgetKind;

/*
 * The Leaf Table word: {tier, slot, version} in one aligned 8-byte store.
 * Storing and persisting it is the commit point of every leaf rewrite,
 * split and migration.  Versions only grow, across reuse of a leaf id too,
 * which is what lets a split record "valid once my origin's version exceeds
 * v" (see split_origin below).
 */
#define AMR_TIER_NONE	0		/* leaf id is free */
#define AMR_TIER_PMEM	1
#define AMR_TIER_SSD	2

#define AMR_WORD_TIER(w)		((uint32_t) ((w) & 0x3))
#define AMR_WORD_SLOT(w)		((uint32_t) (((w) >> 2) & 0x3FFFFFFF))
#define AMR_WORD_VERSION(w)		((uint32_t) ((w) >> 32))
#define AMR_MAKE_WORD(tier, slot, version) \
	((uint64_t) (tier) | ((uint64_t) (slot) << 2) | ((uint64_t) (version) << 32))
#define AMR_MAX_SLOTS			0x3FFFFFFF

#define AMR_INVALID_LEAF		UINT32_MAX

#define AMR_LT_FLAG_NULLS		0x0001	/* leaf holds NULL keys only */

/*
 * lsn_hint bounds the WAL insert positions of the entries of an image from
 * above, in units of 64 KiB (AMR_LSN_HINT_SHIFT), so that pruning after a
 * crash reads only the SSD images that may hold an entry beyond the end of
 * the replayed WAL.  UINT32_MAX means "unknown": read the image.
 */
#define AMR_LSN_HINT_SHIFT		16
#define AMR_LSN_HINT_UNKNOWN	UINT32_MAX

typedef struct AmrLeafTableEntry
{
	uint64_t	word;			/* commit point, see above */
	uint32_t	tree_no;
	uint32_t	tree_generation;
	uint16_t	flags;
	uint16_t	entries;		/* live entries of the image when it was
								 * published (exact for SSD images, which are
								 * immutable; a hint for PMEM ones) */
	uint32_t	split_origin;	/* leaf this one was split from, or
								 * AMR_INVALID_LEAF */
	uint32_t	split_origin_version;	/* origin's version before the split */
	uint32_t	lsn_hint;		/* see above; a switch never lowers it */
	AmrFBox		mbr[2];			/* bounding box of the image of version v is
								 * mbr[v & 1], so the box switches with the
								 * word */
} AmrLeafTableEntry;

/* Leaf image, identical on PMEM and SSD so that migration is a byte copy. */
#define AMR_LEAF_MAGIC			0x4c524d41	/* "AMRL" */
#define AMR_LEAF_FLAG_NULLS		0x0001
#define AMR_LEAF_FLAG_CHECKSUM	0x0002	/* checksum field is valid (SSD) */

typedef struct AmrLeafHeader
{
	uint32_t	magic;
	uint32_t	leaf_id;
	uint32_t	tree_no;
	uint32_t	tree_generation;
	uint32_t	version;		/* Leaf Table version this image belongs to */
	uint32_t	flags;
	uint32_t	checksum;		/* CRC-32C over the image with this field 0 */
	uint32_t	reserved0;
	uint64_t	nentries;		/* 8-byte store: commit point of an append */
	uint64_t	reserved[3];
} AmrLeafHeader;

#define AMR_ENTRY_FLAG_NULL		0x0001	/* key is SQL NULL; box is zero */
#define AMR_ENTRY_FLAG_DEAD		0x0002	/* removed in place by VACUUM when no
										 * slot was free for a rewrite; the
										 * position may be reused */
#define AMR_ENTRY_FLAG_NAN		0x0004	/* key has a NaN coordinate: scans
										 * test it with PostgreSQL's own
										 * operator (amr_fbox_from_box) */

typedef struct AmrLeafEntry
{
	AmrBox		key;
	uint64_t	insert_lsn;		/* WAL insert position at aminsert time */
	uint16_t	tid_blk_hi;		/* ItemPointerData layout */
	uint16_t	tid_blk_lo;
	uint16_t	tid_off;
	uint16_t	flags;
} AmrLeafEntry;

#define AMR_LEAF_CAPACITY \
	((AMR_SLOT_SIZE - sizeof(AmrLeafHeader)) / sizeof(AmrLeafEntry))

typedef struct AmrLeaf
{
	AmrLeafHeader hdr;
	AmrLeafEntry entries[AMR_LEAF_CAPACITY];
} AmrLeaf;

_Static_assert(sizeof(AmrLeafHeader) == 64, "leaf header must be one cache line");
_Static_assert(sizeof(AmrLeafEntry) == 48, "leaf entry layout changed");
_Static_assert(sizeof(AmrLeafTableEntry) == 64, "Leaf Table entry must be one cache line");
_Static_assert(sizeof(AmrTreeRecord) == 64, "tree record must be one cache line");
_Static_assert(sizeof(AmrLeaf) <= AMR_SLOT_SIZE, "leaf does not fit its slot");
_Static_assert(offsetof(AmrLeafTableEntry, word) == 0, "word must be 8-byte aligned");

#endif							/* AMR_FORMAT_H */
