/*-------------------------------------------------------------------------
 *
 * amr_ssdio.c
 *		Reading and writing leaf images in the SSD slot file: O_DIRECT
 *		through io_uring (several slots with one submission) or
 *		pread/pwrite, with wait events, checksums sealed into every image
 *		written, and errors that name the slot and the index.
 *
 * The leaf store (amr_leafstore.c) is the only caller besides
 * amrtree_check and the pruning after a crash, which read the device on
 * purpose.  The file itself is opened by the postmaster (amr_slotfile.c)
 * and its descriptor inherited.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "pgstat.h"
#include "utils/rel.h"
#include "utils/wait_event.h"

/*
 * An error of a transfer of n slots: name the slot that failed (failed, an
 * index into slots[]), not the batch's first, which may be fine; -1 when
 * the failure was the ring's, not one slot's.
 */
static void
ssd_io_error(Relation index, bool write, const uint32 *slots, int n, int failed, int rc)
{
	errno = -rc;
	if (failed < 0 && n > 1)
	{
		if (index != NULL)
			ereport(ERROR,
					(errcode_for_file_access(),
					 write ?
					 errmsg("could not write %d SSD slots of \"%s\" for index \"%s\": %m",
							n, amr_ssd_path, RelationGetRelationName(index)) :
					 errmsg("could not read %d SSD slots of \"%s\" for index \"%s\": %m",
							n, amr_ssd_path, RelationGetRelationName(index))));
		ereport(ERROR,
				(errcode_for_file_access(),
				 write ?
				 errmsg("could not write %d SSD slots of \"%s\": %m", n, amr_ssd_path) :
				 errmsg("could not read %d SSD slots of \"%s\": %m", n, amr_ssd_path)));
	}
	if (failed < 0)
		failed = 0;				/* a single slot: it is the one */
	if (index != NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 write ?
				 errmsg("could not write SSD slot %u of \"%s\" for index \"%s\": %m",
						slots[failed], amr_ssd_path, RelationGetRelationName(index)) :
				 errmsg("could not read SSD slot %u of \"%s\" for index \"%s\": %m",
						slots[failed], amr_ssd_path, RelationGetRelationName(index))));
	ereport(ERROR,
			(errcode_for_file_access(),
			 write ?
			 errmsg("could not write SSD slot %u of \"%s\": %m", slots[failed], amr_ssd_path) :
			 errmsg("could not read SSD slot %u of \"%s\": %m", slots[failed], amr_ssd_path)));
}

void
amr_ssd_read_images(Relation index, const uint32 *slots, AmrLeaf **bufs, int n)
{
	int			rc;
	int			failed;

	if (n == 0)
		return;
	amr_ssd_io.method = (AmrIoMethod) amr_io_method_setting;
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_READ);
	rc = amr_ssd_read_slots(&amr_ssd_io, slots, (void *const *) bufs, n, &failed);
	pgstat_report_wait_end();
	amr_ssd_cache_count_device_reads(n);
	if (rc < 0)
		ssd_io_error(index, false, slots, n, failed, rc);
}

/* The checksum, and bytes past the entries zeroed: they are written too. */
static void
seal_ssd_image(AmrLeaf *img)
{
	Assert(((uintptr_t) img % AMR_SLOT_SIZE) == 0);
	memset((char *) img + amr_leaf_image_bytes(img), 0,
		   AMR_SLOT_SIZE - amr_leaf_image_bytes(img));
	amr_leaf_image_set_checksum(img);
}

void
amr_ssd_write_images(Relation index, const uint32 *slots, AmrLeaf **imgs, int n, bool sync)
{
	int			rc;
	int			i;
	int			failed = -1;

	if (n == 0)
		return;

	/*
	 * a slot freed by a change whose record is not yet durable stays as it
	 * was
	 */
	amr_wb_before_device_write();
	for (i = 0; i < n; i++)
		seal_ssd_image(imgs[i]);
	amr_ssd_io.method = (AmrIoMethod) amr_io_method_setting;
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	if (n == 1)
		rc = amr_ssd_write_slot(&amr_ssd_io, slots[0], imgs[0], sync);
	else
		rc = amr_ssd_write_slots(&amr_ssd_io, slots, (void *const *) imgs, n, &failed);
	pgstat_report_wait_end();
	if (rc < 0)
		ssd_io_error(index, true, slots, n, failed, rc);
	if (sync && n > 1)
		amr_ssd_flush(index);
}

void
amr_ssd_flush(Relation index)
{
	int			rc;

	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_SYNC);
	rc = amr_ssd_sync(&amr_ssd_io);
	pgstat_report_wait_end();
	if (rc < 0)
	{
		errno = -rc;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not fsync \"%s\": %m", amr_ssd_path)));
	}
}
