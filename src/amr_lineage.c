/*-------------------------------------------------------------------------
 *
 * amr_lineage.c
 *		Where in the WAL a pool's contents come from, and refusing a pool
 *		whose contents this data directory's WAL does not lead to
 *		(docs/design.md, "A pool from another life").
 *
 * A pool outside the data directory outlives it: a data directory that is
 * restored from an older backup, re-cloned, or rewound by pg_rewind can
 * meet, at its amrtree.pmem_path, the pool its server wrote later -- same
 * cluster, same index identities.  WAL replay over such a pool is replay
 * over a copy that holds changes the WAL being replayed does not, which
 * breaks the rule replay relies on (amr_walredo.c): entries VACUUM removed
 * in that later life stay removed, and the index misses rows.
 *
 * So the pool records its WAL extent: the timeline and end position of the
 * latest amrtree record whose change it may hold (amr_lineage_note, after
 * every record a backend inserts or replay applies, before the change is
 * made).  A pool is the right one for this data directory only if that
 * point lies on the history of the timeline the server continues on, and
 * not beyond the WAL it continues from:
 *
 *	- after a clean shutdown, the WAL ends with the shutdown checkpoint, and
 *	  every amrtree record precedes it;
 *	- after a crash, the pool may hold changes whose records never became
 *	  durable (the lost tail, pruned and logged again by amr_reconcile.c):
 *	  only the timeline is checked;
 *	- replay from a copy (backup_label, recovery.signal, standby.signal)
 *	  must reach the extent: a copy holds no change beyond the end of the
 *	  backup it was taken in.  Checked as soon as the target timeline is
 *	  known (redo start), as replay passes the extent, and at the end of
 *	  redo; until then the extent waits in check_tli/check_extent, which
 *	  this start's own records cannot overwrite.
 *
 * A pool that fails is reset as one replay could not use (history_reset):
 * its trees are dropped and the indexes rebuilt.
 *
 * What cannot be told apart: a file-system snapshot of a running server's
 * data directory restored beside a pool from a later life starts as crash
 * recovery on the same timeline, exactly like a crash with a lost tail.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <fcntl.h>
#include <unistd.h>

#include "access/timeline.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogreader.h"
#include "access/xlogrecovery.h"
#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/spin.h"

/*
 * Is timeline tli on the history that leads to timeline "to"?  If so, *end
 * is where it ends there: its switch point, InvalidXLogRecPtr for "to"
 * itself.
 */
static bool
history_end_of(TimeLineID tli, TimeLineID to, XLogRecPtr *end)
{
	List	   *history = readTimeLineHistory(to);
	ListCell   *lc;
	bool		found = false;

	foreach(lc, history)
	{
		TimeLineHistoryEntry *e = (TimeLineHistoryEntry *) lfirst(lc);

		if (e->tli == tli)
		{
			*end = e->end;
			found = true;
			break;
		}
	}
	list_free_deep(history);
	return found;
}

/*
 * Does position lsn on timeline tli lie on the history that leads to
 * timeline "to", and not beyond "limit" (InvalidXLogRecPtr: no limit)?
 */
static bool
on_history(TimeLineID tli, XLogRecPtr lsn, TimeLineID to, XLogRecPtr limit)
{
	XLogRecPtr	end;

	/* a record that ends at the switch point precedes it */
	if (!history_end_of(tli, to, &end) ||
		(!XLogRecPtrIsInvalid(end) && lsn > end))
		return false;
	return XLogRecPtrIsInvalid(limit) || lsn <= limit;
}

static void
persist_lineage(AmrPoolHeader *hdr)
{
	amr_persist(&hdr->wal_extent_tli,
				offsetof(AmrPoolHeader, check_extent) + sizeof(hdr->check_extent) -
				offsetof(AmrPoolHeader, wal_extent_tli));
}

/*
 * Give the pool up: its trees are dropped at the end of recovery and the
 * indexes rebuilt (amr_reconcile.c, finish).  From now on the extent is
 * this server's own, starting at (tli, at).
 */
static void
reset_pool(TimeLineID tli, XLogRecPtr at, const char *why)
{
	AmrPoolHeader *hdr = amr_store.header;

	ereport(LOG,
			(errmsg("amrtree: PMEM pool \"%s\" holds changes this data directory's WAL does not lead to; its indexes are rebuilt",
					amr_pool_path_display()),
			 errdetail("The pool holds changes from WAL up to %X/%X on timeline %u; %s.",
					   LSN_FORMAT_ARGS(hdr->check_tli != 0 ? hdr->check_extent : hdr->wal_extent),
					   hdr->check_tli != 0 ? hdr->check_tli : hdr->wal_extent_tli, why),
			 errhint("The pool was left from another life of this server (a data directory restored, re-cloned or rewound while the pool outside it stayed).  Copy the source's pool with the data directory to keep the indexes.")));
	hdr->history_reset = 1;
	amr_persist(&hdr->history_reset, sizeof(hdr->history_reset));
	hdr->check_tli = 0;
	hdr->check_extent = 0;
	hdr->wal_extent_tli = tli;
	hdr->wal_extent = at;
	persist_lineage(hdr);
}

/*
 * A crash: the pool may hold changes whose records were lost with the WAL
 * that was not durable yet (the lost tail).  Their inserts are pruned to
 * the end of the replayed WAL and their leaves logged again
 * (amr_reconcile.c); their removals are of rows that were dead before the
 * last durable record.  So the extent comes back to the checkpoint
 * recovery starts from, and replay brings it up again: otherwise it would
 * stay ahead of the WAL that this life writes over the lost tail, and a
 * clean stop before the WAL passed it would look like another life.
 */
static void
lower_to_checkpoint(TimeLineID tli, XLogRecPtr checkpoint)
{
	AmrPoolHeader *hdr = amr_store.header;

	if (hdr->wal_extent_tli == 0 ||
		(hdr->wal_extent_tli == tli && hdr->wal_extent <= checkpoint))
		return;
	hdr->wal_extent_tli = tli;
	hdr->wal_extent = checkpoint;
	persist_lineage(hdr);
}

/*
 * Replay from a copy resumes behind the pool: unless a check is pending
 * already, the extent the pool has reached becomes the position replay must
 * pass before queries use it (amr_lineage_replay_caught_up).
 */
static void
await_replay_past_extent(AmrPoolHeader *hdr)
{
	if (hdr->check_tli != 0 || hdr->wal_extent_tli == 0)
		return;
	hdr->check_tli = hdr->wal_extent_tli;
	hdr->check_extent = hdr->wal_extent;
	persist_lineage(hdr);
}

static void
clear_check(AmrPoolHeader *hdr)
{
	hdr->check_tli = 0;
	hdr->check_extent = 0;
	persist_lineage(hdr);
}

/*
 * After a record that ends at "end" on timeline tli was inserted, or
 * replayed, and before its change reaches the pool.  Replay also settles a
 * pending check; returns false if that gave the pool up.  A backend calls
 * it inside a critical section: without "replaying" it neither allocates
 * nor fails.  (Replay, outside one, may read timeline history files.)
 */
bool
amr_lineage_note(XLogRecPtr end, TimeLineID tli, bool replaying)
{
	AmrPoolHeader *hdr = amr_store.header;
	bool		changed = false;

	if (hdr == NULL || amr_shared == NULL)
		return true;
	SpinLockAcquire(&amr_shared->lineage_mutex);
	if (hdr->wal_extent_tli != tli || hdr->wal_extent < end)
	{
		hdr->wal_extent_tli = tli;
		hdr->wal_extent = end;
		changed = true;
	}
	SpinLockRelease(&amr_shared->lineage_mutex);

	/* a written-back file gets it before any page (amr_writeback.c) */
	if (changed && !amr_wb_active())
		persist_lineage(hdr);

	if (replaying && hdr->check_tli != 0)
	{
		static TimeLineID judged_tli = 0;
		static XLogRecPtr judged_until = InvalidXLogRecPtr;

		if (tli == hdr->check_tli)
		{
			if (end >= hdr->check_extent)
				clear_check(hdr);
			return true;
		}
		if (tli != judged_tli)
		{
			judged_tli = tli;

			/* a later timeline: it branched off after the extent, or before */
			if (on_history(hdr->check_tli, hdr->check_extent, tli, InvalidXLogRecPtr))
			{
				clear_check(hdr);
				return true;
			}

			/*
			 * Or an earlier one that leads to the extent's: a cascaded
			 * standby restarted after a crash resumes at a restartpoint from
			 * before its upstream's promotion, on the old timeline, and
			 * follows it to the switch point (this gave its pool up).
			 */
			if (!history_end_of(tli, hdr->check_tli, &judged_until))
				judged_until = InvalidXLogRecPtr;
		}
		if (XLogRecPtrIsInvalid(judged_until) || end > judged_until)
		{
			reset_pool(tli, end, psprintf("replay follows timeline %u, which branched off before it", tli));
			return false;
		}
	}
	return true;
}

/* ---- the end of the WAL in pg_wal ---- */

/* What local_wal_page_read keeps between pages. */
typedef struct LocalWal
{
	int			fd;				/* the segment being read, or -1 */
	XLogSegNo	segno;
	TimeLineID	newest_tli;		/* the newest timeline a segment is named for */
} LocalWal;

/*
 * An XLogReader page callback over the segments in pg_wal (the
 * postmaster's working directory is the data directory).  Of the copies
 * of a segment on several timelines, the newest one's holds the WAL replay
 * follows there.
 */
static int
local_wal_page_read(XLogReaderState *reader, XLogRecPtr page, int reqLen,
					XLogRecPtr targetRecPtr, char *buf)
{
	LocalWal   *lw = (LocalWal *) reader->private_data;
	int			seg_size = reader->segcxt.ws_segsize;
	XLogSegNo	segno;
	TimeLineID	tli;

	XLByteToSeg(page, segno, seg_size);
	if (lw->fd < 0 || lw->segno != segno)
	{
		if (lw->fd >= 0)
			close(lw->fd);
		lw->fd = -1;
		for (tli = lw->newest_tli; tli > 0 && lw->fd < 0; tli--)
		{
			char		path[MAXPGPATH];

			XLogFilePath(path, tli, segno, seg_size);
			lw->fd = open(path, O_RDONLY | PG_BINARY, 0);
		}
		if (lw->fd < 0)
			return -1;
		lw->segno = segno;
	}
	if (pg_pread(lw->fd, buf, XLOG_BLCKSZ, XLogSegmentOffset(page, seg_size)) != XLOG_BLCKSZ)
		return -1;
	return XLOG_BLCKSZ;
}

static TimeLineID
newest_segment_timeline(int seg_size)
{
	DIR		   *dir = AllocateDir(XLOGDIR);
	struct dirent *de;
	TimeLineID	newest = 0;

	while ((de = ReadDir(dir, XLOGDIR)) != NULL)
	{
		TimeLineID	tli;
		XLogSegNo	segno;

		if (!IsXLogFileName(de->d_name))
			continue;
		XLogFromFileName(de->d_name, &tli, &segno, seg_size);
		newest = Max(newest, tli);
	}
	FreeDir(dir);
	return newest;
}

/*
 * The end of the last valid record of the WAL in pg_wal, and the timeline
 * of its page, reading from the first record that begins at or after
 * "from"; false if there is none.
 */
static bool
local_wal_end(const ControlFileData *cf, XLogRecPtr from, XLogRecPtr *end, TimeLineID *end_tli)
{
	LocalWal	lw = {-1, 0, 0};
	XLogReaderState *reader;
	XLogRecPtr	first;
	char	   *errormsg;

	*end = InvalidXLogRecPtr;
	*end_tli = 0;
	if (XLogRecPtrIsInvalid(from))
		return false;
	lw.newest_tli = newest_segment_timeline(cf->xlog_seg_size);
	reader = XLogReaderAllocate(cf->xlog_seg_size, NULL,
								XL_ROUTINE(.page_read = local_wal_page_read), &lw);
	if (reader == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory while reading the WAL in pg_wal")));
	reader->system_identifier = cf->system_identifier;
	first = XLogFindNextRecord(reader, from);
	if (!XLogRecPtrIsInvalid(first))
	{
		XLogBeginRead(reader, first);
		while (XLogReadRecord(reader, &errormsg) != NULL)
		{
			*end = reader->EndRecPtr;
			*end_tli = reader->latestPageTLI;
		}
	}
	XLogReaderFree(reader);
	if (lw.fd >= 0)
		close(lw.fd);
	return *end_tli != 0;
}

/*
 * Postmaster, loading a written-back file that WAL replay wrote without
 * syncing before the machine restarted (amr_writeback.c, "during
 * recovery"): hdr is the loaded copy's header, "from" the replay position
 * of the file's last sync.  Replay put the header's extent into the page
 * cache before each page, but an operating-system crash keeps any subset
 * of unsynced writes: the pages may hold changes from beyond the extent
 * the header kept, up to where replay had got.  Replay reads only WAL that
 * is durable in pg_wal (the WAL receiver flushes before it lets replay on;
 * a segment restored from an archive is kept there under its name), so
 * the end of the last valid record there bounds it.  Raise the extent, and
 * a pending check, to that end: a hot standby's queries then wait until
 * replay has passed it (amr_lineage_replay_caught_up), as after a stop.
 * The caller writes the header.
 */
void
amr_lineage_after_unsynced_replay(AmrPoolHeader *hdr, XLogRecPtr from)
{
	bool		crc_ok = false;
	ControlFileData *cf = get_controlfile(DataDir, &crc_ok);
	XLogRecPtr	end;
	TimeLineID	end_tli;
	bool		found;

	/* with a bad control file PostgreSQL refuses to start */
	found = crc_ok && local_wal_end(cf, from, &end, &end_tli);
	pfree(cf);
	if (!found || end_tli < hdr->wal_extent_tli ||
		(end_tli == hdr->wal_extent_tli && end <= hdr->wal_extent))
		return;
	ereport(LOG,
			(errmsg("amrtree: pool \"%s\" was written by WAL replay that had not synced it when the machine restarted; its WAL extent is raised from %X/%X to %X/%X, the end of the WAL in pg_wal",
					amr_pool_path_display(), LSN_FORMAT_ARGS(hdr->wal_extent), LSN_FORMAT_ARGS(end)),
			 errdetail("The file may hold changes from beyond the extent its header kept.  A hot standby uses its amrtree indexes once replay passes %X/%X.",
					   LSN_FORMAT_ARGS(end))));
	hdr->wal_extent_tli = end_tli;
	hdr->wal_extent = end;
	if (hdr->check_tli != 0 &&
		(end_tli > hdr->check_tli || (end_tli == hdr->check_tli && end > hdr->check_extent)))
	{
		hdr->check_tli = end_tli;
		hdr->check_extent = end;
	}
}

/*
 * A pool upgraded from version 2 at this start, replayed over as a copy:
 * its extent is unknown.  A standby's own pool holds nothing replay had not
 * read, and replay reads only WAL durable in pg_wal, so the end of that WAL
 * bounds it: checking that, a hot standby restarted onto this version does
 * not answer from a pool ahead of replay (amr_lineage_replay_caught_up).
 * A pool from another life stays undetected, as before the extent existed.
 */
static void
extent_from_local_wal(AmrPoolHeader *hdr, const ControlFileData *cf)
{
	XLogRecPtr	end;
	TimeLineID	end_tli;

	if (!local_wal_end(cf, cf->checkPointCopy.redo, &end, &end_tli))
		return;
	ereport(LOG,
			(errmsg("amrtree: pool \"%s\" does not record where in the WAL its contents come from; taking %X/%X, the end of the WAL in pg_wal",
					amr_pool_path_display(), LSN_FORMAT_ARGS(end)),
			 errdetail("A pool upgraded from format version 2 records it from its first change on.  A hot standby uses its amrtree indexes once replay passes %X/%X.",
					   LSN_FORMAT_ARGS(end))));
	hdr->wal_extent_tli = hdr->check_tli = end_tli;
	hdr->wal_extent = hdr->check_extent = end;
	persist_lineage(hdr);
}

/*
 * Postmaster, the pool just opened, before any process uses it: decide what
 * the control file and the timeline history files decide now, and leave the
 * rest to replay.  cf: the control file, NULL if its CRC is wrong (then
 * PostgreSQL refuses to start).  replay_from_copy: backup_label,
 * recovery.signal or standby.signal is present.  upgraded: the pool was
 * upgraded from format version 2 at this start.
 */
void
amr_lineage_at_open(const ControlFileData *cf, bool replay_from_copy, bool upgraded)
{
	AmrPoolHeader *hdr = amr_store.header;
	TimeLineID	tli = hdr->check_tli != 0 ? hdr->check_tli : hdr->wal_extent_tli;
	XLogRecPtr	extent = hdr->check_tli != 0 ? hdr->check_extent : hdr->wal_extent;
	TimeLineID	cf_tli;

	if (tli == 0)
	{
		/* a new pool, one that recorded nothing, or one just upgraded */
		if (upgraded && replay_from_copy && cf != NULL)
			extent_from_local_wal(hdr, cf);
		return;
	}
	if (replay_from_copy)
	{
		await_replay_past_extent(hdr);
		return;
	}
	if (cf == NULL)
		return;
	cf_tli = cf->checkPointCopy.ThisTimeLineID;
	if (cf->state == DB_SHUTDOWNED)
	{
		if (!on_history(tli, extent, cf_tli, cf->checkPoint))
			reset_pool(cf_tli, cf->checkPoint,
					   psprintf("this data directory was shut down at %X/%X on timeline %u",
								LSN_FORMAT_ARGS(cf->checkPoint), cf_tli));
		else if (hdr->check_tli != 0)
			clear_check(hdr);
	}
	else if (!on_history(tli, extent, cf_tli, InvalidXLogRecPtr))
		reset_pool(cf_tli, cf->checkPoint,
				   psprintf("this data directory continues on timeline %u, which branched off before it",
							cf_tli));
	else
	{
		if (hdr->check_tli != 0)
			clear_check(hdr);
		lower_to_checkpoint(cf_tli, cf->checkPoint);
	}
}

/*
 * Postmaster, restarting its children after one crashed: the pool is this
 * server's own, on its timeline; see lower_to_checkpoint.  A standby (or an
 * archive recovery, replay_from_copy) resumes replay from its last
 * restartpoint with the pool holding everything replayed before the crash,
 * as after a stop: the extent replay reached becomes the check that keeps
 * queries out until replay passes it again (amr_lineage_replay_caught_up).
 */
void
amr_lineage_at_crash_restart(const ControlFileData *cf, bool replay_from_copy)
{
	AmrPoolHeader *hdr = amr_store.header;

	if (cf == NULL || hdr->check_tli != 0)
		return;
	if (replay_from_copy)
		await_replay_past_extent(hdr);
	else
		lower_to_checkpoint(cf->checkPointCopy.ThisTimeLineID, cf->checkPoint);
}

/*
 * Startup process, at the start of redo from a copy: the target timeline
 * is known.  Returns false if the pool was given up.
 */
bool
amr_lineage_at_redo_start(void)
{
	AmrPoolHeader *hdr = amr_store.header;

	if (hdr->check_tli == 0 ||
		on_history(hdr->check_tli, hdr->check_extent, recoveryTargetTLI, InvalidXLogRecPtr))
		return true;
	reset_pool(recoveryTargetTLI, GetXLogReplayRecPtr(NULL),
			   psprintf("recovery targets timeline %u, which branched off before it",
						recoveryTargetTLI));
	return false;
}

/*
 * A hot standby, any process: has replay passed the extent of the pool it
 * started on?  Until then the pool may hold changes the replayed WAL does
 * not -- a restarted standby's own pool is ahead of where replay resumes,
 * and its removals are of rows that still exist there -- so queries must
 * not use it.  *position says which position replay must pass.
 */
bool
amr_lineage_replay_caught_up(XLogRecPtr *position)
{
	static TimeLineID judged_tli = 0;
	static bool judged_passed = false;
	AmrPoolHeader *hdr = amr_store.header;
	TimeLineID	check_tli = hdr->check_tli;
	XLogRecPtr	check = hdr->check_extent;
	TimeLineID	tli;
	XLogRecPtr	replayed;

	*position = check;
	if (check_tli == 0)
		return true;
	replayed = GetXLogReplayRecPtr(&tli);
	if (tli == check_tli)
		return replayed >= check;
	/* a later timeline: passed if it branched off after the extent */
	if (tli != judged_tli)
	{
		judged_passed = on_history(check_tli, check, tli, InvalidXLogRecPtr);
		judged_tli = tli;
	}
	return judged_passed;
}

/* Startup process, at the end of redo: did replay reach the extent? */
void
amr_lineage_at_redo_end(void)
{
	AmrPoolHeader *hdr = amr_store.header;
	TimeLineID	tli;
	XLogRecPtr	end = GetXLogReplayRecPtr(&tli);

	if (hdr->check_tli == 0 || XLogRecPtrIsInvalid(end))
		return;
	if (on_history(hdr->check_tli, hdr->check_extent, tli, end))
		clear_check(hdr);
	else
		reset_pool(tli, end,
				   psprintf("recovery ended at %X/%X on timeline %u", LSN_FORMAT_ARGS(end), tli));
}
