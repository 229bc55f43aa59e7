/*-------------------------------------------------------------------------
 *
 * amr_wal.h
 *		amrtree's WAL: the records of its custom resource manager, what
 *		writes them (the leaf store, the tree directory, the build) and what
 *		replays them (amr_walredo.c).  docs/design.md, "WAL".
 *
 * Records name a tree by its storage identity (database, tablespace,
 * relfilenode) and a leaf by its logical id, never by slot or tier: where a
 * leaf lives is each server's own business.  Leaf contents travel as
 * entries only; the header fields that depend on the server (tree number,
 * generation, version, checksum) are filled in by the replaying server.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_WAL_H
#define AMR_WAL_H

#include "amrtree.h"

#include "access/xlogreader.h"

/* Record types (the high four bits of xl_info). */
#define XLOG_AMR_TREE_CREATE	0x00	/* a tree is created, BUILDING */
#define XLOG_AMR_TREE_DROP		0x10	/* a tree and all its leaves are freed */
#define XLOG_AMR_TREE_BUILT		0x20	/* a build wrote all its leaves */
#define XLOG_AMR_IMAGES			0x30	/* whole leaf images (see
										 * AmrImageKind) */
#define XLOG_AMR_APPEND			0x40	/* one entry into one position */
#define XLOG_AMR_MARK_DEAD		0x50	/* entries marked dead in place */
#define XLOG_AMR_SPLIT			0x60	/* a leaf split in two */
#define XLOG_AMR_FREE_LEAVES	0x70	/* empty leaves freed by VACUUM */

/* Why whole images were logged; replay treats them all alike. */
typedef enum AmrImageKind
{
	AMR_IMAGE_BUILD = 0,		/* new leaves written by a build */
	AMR_IMAGE_NEW = 1,			/* the first leaf of a tree side */
	AMR_IMAGE_FULL = 2,			/* first change of a leaf after a checkpoint */
	AMR_IMAGE_REWRITE = 3,		/* rewritten out of place (VACUUM, a write
								 * into an SSD leaf) */
	AMR_IMAGE_MOVE = 4,			/* moved to another tier, first time since a
								 * checkpoint */
	AMR_IMAGE_RESYNC = 5,		/* after crash recovery: leaves that changed
								 * beyond the end of the replayed WAL, all of
								 * one tree's (or the last of them) */
	AMR_IMAGE_RESYNC_PART = 6	/* the same, but more of the tree's follow in
								 * the next record (AMR_WAL_MAX_RESYNC_IMAGES) */
} AmrImageKind;

#define AMR_IMAGE_KIND_COUNT 7

/* Is an image kind a resync's (whose replay must look atomic)? */
#define AMR_IMAGE_KIND_IS_RESYNC(kind) \
	((kind) == AMR_IMAGE_RESYNC || (kind) == AMR_IMAGE_RESYNC_PART)

/*
 * A tree: its storage identity, as in its directory record, and the
 * directory record and generation the primary keeps it in.  Replay keeps
 * each tree in the same record with the same generation where it can, so
 * that two trees of one storage (an index rebuilt in place, in the file it
 * already has, supersedes the older tree at commit) stay apart.
 */
typedef struct xl_amr_tree
{
	Oid			db;
	Oid			spc;
	Oid			relfilenode;
	uint32		tree_no;
	uint32		generation;
} xl_amr_tree;

typedef struct xl_amr_tree_create
{
	xl_amr_tree tree;
	uint32		flags;			/* AMR_TREE_FLAG_* */
	Oid			index_oid;
	TransactionId create_xid;
	uint32		budget_kind;
	uint32		tiering_off;
	double		budget_value;
} xl_amr_tree_create;

typedef struct xl_amr_tree_drop
{
	xl_amr_tree tree;
} xl_amr_tree_drop;

typedef struct xl_amr_tree_built
{
	xl_amr_tree tree;
} xl_amr_tree_built;

/* XLOG_AMR_IMAGES: this, then nimages of (xl_amr_image, its entries) */
typedef struct xl_amr_images
{
	xl_amr_tree tree;
	uint16		kind;			/* AmrImageKind */
	uint16		nimages;
} xl_amr_images;

#define AMR_NO_FRESH_ENTRY	0xFFFF

/*
 * Every leaf record carries the leaf's Leaf Table version as the change
 * leaves it.  Versions are each server's own (a move changes it without a
 * record), so only crash recovery of the server that wrote them compares
 * them with its pool's: see amr_walredo.c.
 */
typedef struct xl_amr_image
{
	uint32		leaf_id;
	uint32		version;
	uint16		flags;			/* AMR_LEAF_FLAG_NULLS */
	uint16		nentries;
	uint16		fresh_pos;		/* the entry whose insert_lsn is this record's
								 * end (an append logged as a full image), or
								 * AMR_NO_FRESH_ENTRY */
	uint16		reserved;
} xl_amr_image;

/*
 * XLOG_AMR_APPEND: the entry goes into position pos (the count, or a dead
 * one).  The entry travels without its WAL position (it is the record's
 * end), and the fields are ordered so that the 70 bytes logged make a
 * 96-byte record, as small as GiST's for one tuple: the commonest record.
 */
typedef struct xl_amr_append
{
	AmrBox		key;
	xl_amr_tree tree;
	uint32		leaf_id;
	uint32		version;
	uint16		tid_blk_hi;		/* AmrLeafEntry's */
	uint16		tid_blk_lo;
	uint16		tid_off;
	uint16		flags;
	uint16		pos;
} xl_amr_append;

#define SizeOfXlAmrAppend	(offsetof(xl_amr_append, pos) + sizeof(uint16))

/* XLOG_AMR_MARK_DEAD: this, then npos uint16 positions */
typedef struct xl_amr_mark_dead
{
	xl_amr_tree tree;
	uint32		leaf_id;
	uint32		version;
	uint16		npos;
	uint16		reserved;
} xl_amr_mark_dead;

/* XLOG_AMR_SPLIT: this, then nleft and nright entries */
typedef struct xl_amr_split
{
	xl_amr_tree tree;
	uint32		leaf_id;		/* keeps the left half */
	uint32		right_leaf;		/* new leaf with the right half */
	uint32		left_version;
	uint32		right_version;
	uint16		flags;			/* AMR_LEAF_FLAG_NULLS */
	uint16		nleft;
	uint16		nright;
	uint16		reserved;
} xl_amr_split;

/*
 * XLOG_AMR_FREE_LEAVES: this, then nleaves xl_amr_freed_leaf.  VACUUM logs
 * it holding the index's AccessExclusiveLock, whose own record (logged when
 * it was taken) keeps a hot standby's queries out of the index while this
 * is replayed: see amr_vacuum.c.  The version tells crash recovery the leaf
 * from a later one of the same id (see redo_free_leaves).
 */
typedef struct xl_amr_free_leaves
{
	xl_amr_tree tree;
	uint32		nleaves;
} xl_amr_free_leaves;

typedef struct xl_amr_freed_leaf
{
	uint32		leaf_id;
	uint32		version;		/* its Leaf Table version when freed */
} xl_amr_freed_leaf;

/* ---- writing (amr_wal.c) ---- */

/*
 * Are changes of tree t logged?  Not for unlogged and temporary trees, not
 * during recovery, and not when index (if given) skips WAL (RelationNeedsWAL:
 * wal_level = minimal and a relation created in this transaction).
 */
extern bool amr_wal_wanted(const AmrTree *t, Relation index);

/*
 * Must the next logged change of this leaf carry its whole image?  Yes if
 * no whole image of it was logged since the latest checkpoint's redo
 * pointer (the full-page-write rule; docs/design.md, "Torn copies").
 */
extern bool amr_wal_needs_image(uint32 leaf_id);

/* Was the delta just logged for this leaf its first record after the redo pointer? */
extern bool amr_wal_delta_came_first(uint32 leaf_id);

/*
 * Log the creation of tree tree_no (record rec), if its index is logged.
 * Returns whether it was.
 */
extern bool amr_wal_tree_create(Relation index, uint32 tree_no, const AmrTreeRecord *rec);

/* Log that tree rec is dropped with all its leaves (if it is logged). */
extern void amr_wal_tree_drop(const AmrTreeRecord *rec);

/* Log that a build of tree t has logged all its leaves. */
extern void amr_wal_tree_built(const AmrTree *t);

/* Up to this many images go into one record (callers batch by it). */
#define AMR_WAL_MAX_IMAGES 32

/*
 * Up to this many images of one tree go into one resync record (about 4 MB
 * for full leaves): a tree's resync is atomic for standby scans when it
 * fits one record, and past this it is logged in parts, which a standby's
 * scans refuse to read between (docs/design.md, "WAL").
 */
#define AMR_WAL_MAX_RESYNC_IMAGES 1024

/*
 * Log n whole images of tree t's leaves; fresh_pos (NULL: none) names per
 * image the entry whose insert_lsn is to be the record's end.  Notes each
 * leaf as fully logged.  Returns the record's end.
 */
extern XLogRecPtr amr_wal_images(const AmrTree *t, AmrImageKind kind, int n,
								 const uint32 *leaf_ids, const AmrLeaf *const *imgs,
								 const uint16 *fresh_pos);

/*
 * Log a resync record of tree t (kind AMR_IMAGE_RESYNC, or _PART when more
 * of the tree's follow): n images (leaf ids in leaf_ids) already laid out
 * in data (len bytes) as XLOG_AMR_IMAGES carries them, each an xl_amr_image
 * and its entries.  Not in a critical section.  Notes each leaf as fully
 * logged.  Returns the record's end.
 */
extern XLogRecPtr amr_wal_resync(const AmrTree *t, AmrImageKind kind, int n,
								 const uint32 *leaf_ids, const char *data, Size len);

/*
 * Log an entry going into position pos of a leaf whose version is version.
 * Returns the record's end.
 */
extern XLogRecPtr amr_wal_append(const AmrTree *t, uint32 leaf_id, uint32 version, int pos,
								 const AmrLeafEntry *e);

/* Log entries marked dead in place.  Returns the record's end. */
extern XLogRecPtr amr_wal_mark_dead(const AmrTree *t, uint32 leaf_id, uint32 version,
									const uint16 *pos, int npos);

/* Log a split of leaf_id into left and right (right_leaf).  Returns the end. */
extern XLogRecPtr amr_wal_split(const AmrTree *t, uint32 leaf_id, uint32 right_leaf,
								const AmrLeaf *left, const AmrLeaf *right);

/*
 * Log that n empty leaves of tree t (ids and current versions in leaves)
 * are freed.  Returns the record's end.
 */
extern XLogRecPtr amr_wal_free_leaves(const AmrTree *t, const xl_amr_freed_leaf *leaves,
									  uint32 n);

/*
 * Between logging a change and making it in the pool, a checkpoint must
 * not complete: it would let recovery start after a record whose change
 * was never made (PostgreSQL's DELAY_CHKPT_START, as for commit records).
 * Call inside the critical section that covers both.
 */
extern void amr_wal_hold_checkpoint(void);
extern void amr_wal_release_checkpoint(void);

/* ---- the resource manager (amr_wal.c, redo in amr_walredo.c) ---- */

/* At preload: register amrtree's resource manager under id rmid. */
extern void amr_register_wal_rmgr(int rmid);

extern void amr_redo(XLogReaderState *record);
extern void amr_redo_startup(void);
extern void amr_redo_cleanup(void);
extern void amr_desc(StringInfo buf, XLogReaderState *record);
extern const char *amr_identify(uint8 info);

#endif							/* AMR_WAL_H */
