/*-------------------------------------------------------------------------
 *
 * amr_wal.c
 *		Writing amrtree's WAL records, and describing them for pg_waldump
 *		and pg_walinspect (docs/design.md, "WAL").
 *
 * Every change of persistent amrtree state that a standby or a restored
 * backup must repeat is logged here, called from the one place that makes
 * it: the leaf store for leaves, the tree directory for trees, the build
 * for its leaf images.  The protocol at each of those places is
 *
 *	START_CRIT_SECTION; hold off checkpoints;
 *	log the change (a whole image if the leaf needs one);
 *	make it in the pool, stamping the record's position where recovery
 *	will look for it;
 *	let checkpoints go; END_CRIT_SECTION
 *
 * so that a record never precedes a checkpoint whose redo pointer it
 * follows without its change being made, and a change never reaches the
 * pool without its record being in the WAL buffers first.  A change whose
 * record then never reached durable WAL (a crash before the flush) is found
 * by its stamp and its leaf logged again, whole, after recovery
 * (amr_reconcile.c, "resync").
 *
 *-------------------------------------------------------------------------
 */
#include "amr_wal.h"

#include "access/xlog.h"
#include "access/xloginsert.h"
#include "access/xlog_internal.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/rel.h"

/*
 * Insert the record assembled so far; the pool's WAL extent covers it
 * before the caller makes its change (amr_lineage.c).
 */
static XLogRecPtr
amr_xlog_insert(uint8 info)
{
	XLogRecPtr	end = XLogInsert((RmgrId) amr_wal_rmgr_id, info);

	(void) amr_lineage_note(end, GetWALInsertionTimeLine(), false);
	return end;
}

/* ---- deciding ---- */

/*
 * A change with no record of its own (an unlogged index, or wal_level =
 * minimal) still counts for the pool's WAL extent, at the position WAL
 * insertion has reached: a clean stop's checkpoint lies beyond it, and a
 * data directory put back to an earlier state does not reach it, as for a
 * record (amr_lineage.c).
 */
static void
note_unlogged_change(void)
{
	(void) amr_lineage_note(GetXLogInsertRecPtr(), GetWALInsertionTimeLine(), false);
}

bool
amr_wal_wanted(const AmrTree *t, Relation index)
{
	const AmrTreeRecord *rec = &amr_store.tree_records[t->tree_no];

	if (rec->flags & AMR_TREE_FLAG_TEMP)
		return false;			/* gone at any restart */
	if (RecoveryInProgress())
		return false;
	if (rec->flags & AMR_TREE_FLAG_UNLOGGED)
	{
		note_unlogged_change();
		return false;
	}
	if (index != NULL && !RelationNeedsWAL(index))
	{
		/* wal_level = minimal, created in this transaction: synced at commit */
		amr_wb_note_wal_skipped();
		note_unlogged_change();
		return false;
	}
	return true;
}

bool
amr_wal_needs_image(uint32 leaf_id)
{
	return amr_store.leaves[leaf_id].full_image_lsn <= GetRedoRecPtr();
}

/*
 * After a delta (APPEND, MARK_DEAD) of leaf_id was logged: was it the leaf's
 * first record after a checkpoint's redo pointer, which amr_wal_needs_image
 * meant to prevent?  It looked at the redo pointer before XLogInsert, and a
 * checkpoint may have fixed a new one in between (the backend preempted
 * there, or GetRedoRecPtr's copy lagging the insertion lock's).
 * XLogInsert brings this backend's copy up to the one its record was
 * inserted under, with the insertion lock held; GetFullPageWriteInfo reads
 * that copy, so the answer is exact.  The caller then logs the leaf whole.
 */
bool
amr_wal_delta_came_first(uint32 leaf_id)
{
	XLogRecPtr	redo;
	bool		page_writes;

	GetFullPageWriteInfo(&redo, &page_writes);
	return amr_store.leaves[leaf_id].full_image_lsn <= redo;
}

void
amr_wal_hold_checkpoint(void)
{
	Assert(CritSectionCount > 0);
	Assert((MyProc->delayChkptFlags & DELAY_CHKPT_START) == 0);
	MyProc->delayChkptFlags |= DELAY_CHKPT_START;
	amr_wb_change_begin();
}

void
amr_wal_release_checkpoint(void)
{
	amr_wb_change_end();
	MyProc->delayChkptFlags &= ~DELAY_CHKPT_START;
}

static void
tree_ref(const AmrTreeRecord *rec, xl_amr_tree *ref)
{
	ref->db = rec->db_oid;
	ref->spc = rec->spc_oid;
	ref->relfilenode = rec->relfilenode;
	ref->tree_no = (uint32) (rec - amr_store.tree_records);
	ref->generation = rec->generation;
}

/* ---- trees ---- */

bool
amr_wal_tree_create(Relation index, uint32 tree_no, const AmrTreeRecord *rec)
{
	xl_amr_tree_create xlrec;

	/*
	 * Unlogged indexes log their tree (not its leaves), so that a promoted
	 * standby has the empty tree their reset index points at, as it has the
	 * init fork.  Temporary ones and those that skip WAL (wal_level =
	 * minimal, created in this transaction) log nothing.
	 */
	if (rec->flags & AMR_TREE_FLAG_TEMP)
		return false;
	if (!(rec->flags & AMR_TREE_FLAG_UNLOGGED) ? !RelationNeedsWAL(index) : !XLogIsNeeded())
		return false;
	memset(&xlrec, 0, sizeof(xlrec));
	tree_ref(rec, &xlrec.tree);
	Assert(xlrec.tree.tree_no == tree_no);
	xlrec.flags = rec->flags;
	xlrec.index_oid = rec->index_oid;
	xlrec.create_xid = rec->create_xid;
	xlrec.budget_kind = rec->budget_kind;
	xlrec.tiering_off = rec->tiering_off;
	xlrec.budget_value = rec->budget_value;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	(void) amr_xlog_insert(XLOG_AMR_TREE_CREATE);
	return true;
}

void
amr_wal_tree_drop(const AmrTreeRecord *rec)
{
	xl_amr_tree_drop xlrec;

	if ((rec->flags & AMR_TREE_FLAG_TEMP) || !XLogInsertAllowed())
		return;
	tree_ref(rec, &xlrec.tree);
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	(void) amr_xlog_insert(XLOG_AMR_TREE_DROP);
}

void
amr_wal_tree_built(const AmrTree *t)
{
	xl_amr_tree_built xlrec;

	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	(void) amr_xlog_insert(XLOG_AMR_TREE_BUILT);
}

/* ---- leaves ---- */

XLogRecPtr
amr_wal_images(const AmrTree *t, AmrImageKind kind, int n, const uint32 *leaf_ids,
			   const AmrLeaf *const *imgs, const uint16 *fresh_pos)
{
	xl_amr_images xlrec;
	xl_amr_image heads[AMR_WAL_MAX_IMAGES];
	XLogRecPtr	end;
	int			i;

	Assert(n > 0 && n <= AMR_WAL_MAX_IMAGES);
	/* more pieces than XLogInsert takes by default: ask before we start */
	if (CritSectionCount == 0)
		XLogEnsureRecordSpace(0, 1 + 2 * n);
	else
		Assert(1 + 2 * n <= XLR_NORMAL_RDATAS);

	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	xlrec.kind = (uint16) kind;
	xlrec.nimages = (uint16) n;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	for (i = 0; i < n; i++)
	{
		heads[i].leaf_id = leaf_ids[i];
		/* every image carries the version its word switches (switched) to */
		heads[i].version = imgs[i]->hdr.version;
		heads[i].flags = (uint16) (imgs[i]->hdr.flags & AMR_LEAF_FLAG_NULLS);
		heads[i].nentries = (uint16) imgs[i]->hdr.nentries;
		heads[i].fresh_pos = fresh_pos ? fresh_pos[i] : AMR_NO_FRESH_ENTRY;
		heads[i].reserved = 0;
		XLogRegisterData((char *) &heads[i], sizeof(xl_amr_image));
		if (heads[i].nentries > 0)
			XLogRegisterData((char *) imgs[i]->entries,
							 heads[i].nentries * sizeof(AmrLeafEntry));
	}
	end = amr_xlog_insert(XLOG_AMR_IMAGES);
	for (i = 0; i < n; i++)
		amr_store.leaves[leaf_ids[i]].full_image_lsn = end;
	return end;
}

XLogRecPtr
amr_wal_resync(const AmrTree *t, AmrImageKind kind, int n, const uint32 *leaf_ids,
			   const char *data, Size len)
{
	xl_amr_images xlrec;
	XLogRecPtr	end;
	int			i;

	Assert(AMR_IMAGE_KIND_IS_RESYNC(kind));
	Assert(n > 0 && n <= AMR_WAL_MAX_RESYNC_IMAGES);
	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	xlrec.kind = (uint16) kind;
	xlrec.nimages = (uint16) n;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	XLogRegisterData((char *) data, (uint32) len);
	end = amr_xlog_insert(XLOG_AMR_IMAGES);
	for (i = 0; i < n; i++)
		amr_store.leaves[leaf_ids[i]].full_image_lsn = end;
	return end;
}

XLogRecPtr
amr_wal_append(const AmrTree *t, uint32 leaf_id, uint32 version, int pos,
			   const AmrLeafEntry *e)
{
	xl_amr_append xlrec;

	memset(&xlrec, 0, sizeof(xlrec));
	xlrec.key = e->key;
	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	xlrec.leaf_id = leaf_id;
	xlrec.version = version;
	xlrec.tid_blk_hi = e->tid_blk_hi;
	xlrec.tid_blk_lo = e->tid_blk_lo;
	xlrec.tid_off = e->tid_off;
	xlrec.flags = e->flags;
	xlrec.pos = (uint16) pos;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, SizeOfXlAmrAppend);
	return amr_xlog_insert(XLOG_AMR_APPEND);
}

XLogRecPtr
amr_wal_mark_dead(const AmrTree *t, uint32 leaf_id, uint32 version, const uint16 *pos,
				  int npos)
{
	xl_amr_mark_dead xlrec;

	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	xlrec.leaf_id = leaf_id;
	xlrec.version = version;
	xlrec.npos = (uint16) npos;
	xlrec.reserved = 0;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	XLogRegisterData((char *) pos, npos * sizeof(uint16));
	return amr_xlog_insert(XLOG_AMR_MARK_DEAD);
}

XLogRecPtr
amr_wal_split(const AmrTree *t, uint32 leaf_id, uint32 right_leaf,
			  const AmrLeaf *left, const AmrLeaf *right)
{
	xl_amr_split xlrec;
	XLogRecPtr	end;

	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	xlrec.leaf_id = leaf_id;
	xlrec.right_leaf = right_leaf;
	xlrec.left_version = left->hdr.version;
	xlrec.right_version = right->hdr.version;
	xlrec.flags = (uint16) (left->hdr.flags & AMR_LEAF_FLAG_NULLS);
	xlrec.nleft = (uint16) left->hdr.nentries;
	xlrec.nright = (uint16) right->hdr.nentries;
	xlrec.reserved = 0;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	if (xlrec.nleft > 0)
		XLogRegisterData((char *) left->entries, xlrec.nleft * sizeof(AmrLeafEntry));
	if (xlrec.nright > 0)
		XLogRegisterData((char *) right->entries, xlrec.nright * sizeof(AmrLeafEntry));
	end = amr_xlog_insert(XLOG_AMR_SPLIT);
	/* both halves travel whole: each counts as fully logged */
	amr_store.leaves[leaf_id].full_image_lsn = end;
	amr_store.leaves[right_leaf].full_image_lsn = end;
	return end;
}

XLogRecPtr
amr_wal_free_leaves(const AmrTree *t, const xl_amr_freed_leaf *leaves, uint32 n)
{
	xl_amr_free_leaves xlrec;

	tree_ref(&amr_store.tree_records[t->tree_no], &xlrec.tree);
	xlrec.nleaves = n;
	XLogBeginInsert();
	XLogRegisterData((char *) &xlrec, sizeof(xlrec));
	XLogRegisterData((char *) leaves, n * sizeof(xl_amr_freed_leaf));
	return amr_xlog_insert(XLOG_AMR_FREE_LEAVES);
}

/* ---- describing ---- */

static const char *const image_kind_names[AMR_IMAGE_KIND_COUNT] = {
	"build", "new", "full", "rewrite", "move", "resync", "resync part"
};

const char *
amr_identify(uint8 info)
{
	switch (info & ~XLR_INFO_MASK)
	{
		case XLOG_AMR_TREE_CREATE:
			return "TREE_CREATE";
		case XLOG_AMR_TREE_DROP:
			return "TREE_DROP";
		case XLOG_AMR_TREE_BUILT:
			return "TREE_BUILT";
		case XLOG_AMR_IMAGES:
			return "IMAGES";
		case XLOG_AMR_APPEND:
			return "APPEND";
		case XLOG_AMR_MARK_DEAD:
			return "MARK_DEAD";
		case XLOG_AMR_SPLIT:
			return "SPLIT";
		case XLOG_AMR_FREE_LEAVES:
			return "FREE_LEAVES";
	}
	return NULL;
}

static void
desc_tree(StringInfo buf, const xl_amr_tree *t)
{
	appendStringInfo(buf, "rel %u/%u/%u tree %u/%u", t->spc, t->db, t->relfilenode,
					 t->tree_no, t->generation);
}

void
amr_desc(StringInfo buf, XLogReaderState *record)
{
	char	   *rec = XLogRecGetData(record);
	Size		len = XLogRecGetDataLen(record);

	switch (XLogRecGetInfo(record) & ~XLR_INFO_MASK)
	{
		case XLOG_AMR_TREE_CREATE:
			if (len >= sizeof(xl_amr_tree_create))
			{
				xl_amr_tree_create *x = (xl_amr_tree_create *) rec;

				desc_tree(buf, &x->tree);
				appendStringInfo(buf, "; flags 0x%x index %u xid %u",
								 x->flags, x->index_oid, x->create_xid);
			}
			break;
		case XLOG_AMR_TREE_DROP:
		case XLOG_AMR_TREE_BUILT:
			if (len >= sizeof(xl_amr_tree))
				desc_tree(buf, (xl_amr_tree *) rec);
			break;
		case XLOG_AMR_IMAGES:
			if (len >= sizeof(xl_amr_images))
			{
				xl_amr_images *x = (xl_amr_images *) rec;
				Size		off = sizeof(xl_amr_images);
				int			i;

				desc_tree(buf, &x->tree);
				appendStringInfo(buf, "; %s, %u images:",
								 x->kind < AMR_IMAGE_KIND_COUNT ? image_kind_names[x->kind] : "?",
								 x->nimages);
				for (i = 0; i < x->nimages && off + sizeof(xl_amr_image) <= len; i++)
				{
					xl_amr_image h;

					memcpy(&h, rec + off, sizeof(h));
					appendStringInfo(buf, " leaf %u v%u (%u entries)", h.leaf_id, h.version,
									 h.nentries);
					off += sizeof(h) + h.nentries * sizeof(AmrLeafEntry);
				}
			}
			break;
		case XLOG_AMR_APPEND:
			if (len >= SizeOfXlAmrAppend)
			{
				xl_amr_append x;

				memcpy(&x, rec, SizeOfXlAmrAppend);
				desc_tree(buf, &x.tree);
				appendStringInfo(buf, "; leaf %u v%u pos %u", x.leaf_id, x.version, x.pos);
			}
			break;
		case XLOG_AMR_MARK_DEAD:
			if (len >= sizeof(xl_amr_mark_dead))
			{
				xl_amr_mark_dead *x = (xl_amr_mark_dead *) rec;

				desc_tree(buf, &x->tree);
				appendStringInfo(buf, "; leaf %u v%u, %u entries", x->leaf_id, x->version, x->npos);
			}
			break;
		case XLOG_AMR_SPLIT:
			if (len >= sizeof(xl_amr_split))
			{
				xl_amr_split *x = (xl_amr_split *) rec;

				desc_tree(buf, &x->tree);
				appendStringInfo(buf, "; leaf %u v%u (%u entries) -> right leaf %u v%u (%u entries)",
								 x->leaf_id, x->left_version, x->nleft, x->right_leaf,
								 x->right_version, x->nright);
			}
			break;
		case XLOG_AMR_FREE_LEAVES:
			if (len >= sizeof(xl_amr_free_leaves))
			{
				xl_amr_free_leaves *x = (xl_amr_free_leaves *) rec;
				uint32		i;

				desc_tree(buf, &x->tree);
				appendStringInfo(buf, "; %u leaves:", x->nleaves);
				for (i = 0; i < x->nleaves &&
					 sizeof(xl_amr_free_leaves) + (i + 1) * sizeof(xl_amr_freed_leaf) <= len; i++)
				{
					xl_amr_freed_leaf f;

					memcpy(&f, rec + sizeof(xl_amr_free_leaves) + i * sizeof(f), sizeof(f));
					appendStringInfo(buf, " %u v%u", f.leaf_id, f.version);
				}
			}
			break;
	}
}

static RmgrData amr_rmgr = {
	.rm_name = "amrtree",
	.rm_redo = amr_redo,
	.rm_desc = amr_desc,
	.rm_identify = amr_identify,
	.rm_startup = amr_redo_startup,
	.rm_cleanup = amr_redo_cleanup,
};

void
amr_register_wal_rmgr(int rmid)
{
	RegisterCustomRmgr((RmgrId) rmid, &amr_rmgr);
}
