/*-------------------------------------------------------------------------
 *
 * amr_ssd.c
 *		SSD slot I/O with io_uring (a ring per process, created on first
 *		use) or plain pread/pwrite.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_ssd.h"
#include "amr_tree.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#define AMR_RING_DEPTH 64

uint32_t
amr_ssd_header_checksum(const AmrSsdHeader *h)
{
	AmrSsdHeader copy = *h;

	copy.checksum = 0;
	return amr_crc32c(&copy, sizeof(copy));
}

int
amr_ssd_uring_probe(void)
{
	struct io_uring ring;
	int			rc = io_uring_queue_init(AMR_RING_DEPTH, &ring, 0);

	if (rc == 0)
		io_uring_queue_exit(&ring);
	return rc;
}

/*
 * Does this process use pread/pwrite: by setting, or because it could not
 * set up its ring (tried once; a process that cannot now will not later,
 * and pread/pwrite are as correct, only slower)?
 */
static bool
use_sync_io(AmrSsdIo *io)
{
	struct io_uring *ring;
	int			rc;

	if (io->method == AMR_IO_SYNC || io->ring_error < 0)
		return true;
	if (io->ring_ready)
		return false;
	ring = calloc(1, sizeof(struct io_uring));
	if (ring == NULL)
		return true;			/* try again next time */
	rc = io_uring_queue_init(AMR_RING_DEPTH, ring, 0);
	if (rc < 0)
	{
		free(ring);
		io->ring_error = rc;
		return true;
	}
	io->ring = ring;
	io->depth = AMR_RING_DEPTH;
	io->ring_ready = true;
	return false;
}

void
amr_ssd_io_close(AmrSsdIo *io)
{
	if (io->ring_ready)
	{
		io_uring_queue_exit((struct io_uring *) io->ring);
		free(io->ring);
		io->ring = NULL;
		io->ring_ready = false;
	}
}

static int
pread_full(int fd, void *buf, uint64_t off)
{
	size_t		done = 0;

	while (done < AMR_SLOT_SIZE)
	{
		ssize_t		r = pread(fd, (char *) buf + done, AMR_SLOT_SIZE - done,
							  (off_t) (off + done));

		if (r < 0)
		{
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EIO;		/* beyond the end: a truncated file */
		done += (size_t) r;
	}
	return 0;
}

static int
pwrite_full(int fd, const void *buf, uint64_t off)
{
	size_t		done = 0;

	while (done < AMR_SLOT_SIZE)
	{
		ssize_t		r = pwrite(fd, (const char *) buf + done, AMR_SLOT_SIZE - done,
							   (off_t) (off + done));

		if (r < 0)
		{
			if (errno == EINTR)
				continue;
			return -errno;
		}
		done += (size_t) r;
	}
	return 0;
}

/*
 * n reads or writes of whole slots: with io_uring, up to the ring's depth
 * submitted at once and then reaped, so that a batch costs one submission
 * and one wait rather than n of each.
 */
static int
transfer_slots(AmrSsdIo *io, const uint32_t *slots, void *const *bufs, int n,
			   bool write, int *failed)
{
	struct io_uring *ring;
	int			first_error = 0;
	int			i;

	*failed = -1;
	if (use_sync_io(io))
	{
		for (i = 0; i < n; i++)
		{
			uint64_t	off = amr_ssd_offset(slots[i]);
			int			rc = write ? pwrite_full(io->fd, bufs[i], off) :
			pread_full(io->fd, bufs[i], off);

			if (rc < 0)
			{
				*failed = i;
				return rc;
			}
		}
		return 0;
	}

	ring = (struct io_uring *) io->ring;

	for (i = 0; i < n; i += io->depth)
	{
		int			batch = n - i < io->depth ? n - i : io->depth;
		int			j;
		int			rc;

		for (j = 0; j < batch; j++)
		{
			struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

			if (write)
				io_uring_prep_write(sqe, io->fd, bufs[i + j], AMR_SLOT_SIZE,
									amr_ssd_offset(slots[i + j]));
			else
				io_uring_prep_read(sqe, io->fd, bufs[i + j], AMR_SLOT_SIZE,
								   amr_ssd_offset(slots[i + j]));
			io_uring_sqe_set_data(sqe, (void *) (uintptr_t) (i + j));
		}
		do
			rc = io_uring_submit_and_wait(ring, (unsigned) batch);
		while (rc == -EINTR);
		if (rc < 0)
		{
			*failed = -1;
			return rc;
		}
		for (j = 0; j < batch; j++)
		{
			struct io_uring_cqe *cqe;
			int			res;
			int			k;

			do
				rc = io_uring_wait_cqe(ring, &cqe);
			while (rc == -EINTR);
			if (rc < 0)
			{
				*failed = -1;
				return rc;
			}
			res = cqe->res;
			k = (int) (uintptr_t) io_uring_cqe_get_data(cqe);
			io_uring_cqe_seen(ring, cqe);
			if (res == -EAGAIN || res == -EINTR || (res >= 0 && res < AMR_SLOT_SIZE))
			{
				/* rare: retry this one synchronously */
				uint64_t	off = amr_ssd_offset(slots[k]);

				res = write ? pwrite_full(io->fd, bufs[k], off) :
					pread_full(io->fd, bufs[k], off);
				if (res == 0)
					res = AMR_SLOT_SIZE;
			}
			if (res < 0 && first_error == 0)
			{
				first_error = res;
				*failed = k;
			}
		}
	}
	return first_error;
}

int
amr_ssd_read_slots(AmrSsdIo *io, const uint32_t *slots, void *const *bufs, int n,
				   int *failed)
{
	return transfer_slots(io, slots, bufs, n, false, failed);
}

int
amr_ssd_write_slots(AmrSsdIo *io, const uint32_t *slots, void *const *bufs, int n,
					int *failed)
{
	return transfer_slots(io, slots, bufs, n, true, failed);
}

int
amr_ssd_sync(AmrSsdIo *io)
{
	if (io->sync != AMR_SSD_SYNC_FDATASYNC)
		return 0;
	return fdatasync(io->fd) == 0 ? 0 : -errno;
}

int
amr_ssd_write_slot(AmrSsdIo *io, uint32_t slot, const void *buf, bool sync)
{
	struct io_uring *ring;
	struct io_uring_sqe *sqe;
	int			rc;
	int			i;
	int			n = (sync && io->sync == AMR_SSD_SYNC_FDATASYNC) ? 2 : 1;
	int			first_error = 0;

	if (use_sync_io(io))
	{
		rc = pwrite_full(io->fd, buf, amr_ssd_offset(slot));
		if (rc < 0)
			return rc;
		if (n == 2 && fdatasync(io->fd) != 0)
			return -errno;
		return 0;
	}

	ring = (struct io_uring *) io->ring;
	sqe = io_uring_get_sqe(ring);
	io_uring_prep_write(sqe, io->fd, buf, AMR_SLOT_SIZE, amr_ssd_offset(slot));
	io_uring_sqe_set_data(sqe, (void *) (uintptr_t) 1);
	if (n == 2)
	{
		/* the sync runs only after the write completed */
		sqe->flags |= IOSQE_IO_LINK;
		sqe = io_uring_get_sqe(ring);
		io_uring_prep_fsync(sqe, io->fd, IORING_FSYNC_DATASYNC);
		io_uring_sqe_set_data(sqe, (void *) (uintptr_t) 2);
	}
	do
		rc = io_uring_submit_and_wait(ring, (unsigned) n);
	while (rc == -EINTR);
	if (rc < 0)
		return rc;
	for (i = 0; i < n; i++)
	{
		struct io_uring_cqe *cqe;

		do
			rc = io_uring_wait_cqe(ring, &cqe);
		while (rc == -EINTR);
		if (rc < 0)
			return rc;
		if (cqe->res < 0 && first_error == 0)
			first_error = cqe->res;
		else if ((uintptr_t) io_uring_cqe_get_data(cqe) == 1 &&
				 cqe->res >= 0 && cqe->res < AMR_SLOT_SIZE && first_error == 0)
			first_error = -EIO; /* short write */
		io_uring_cqe_seen(ring, cqe);
	}
	return first_error;
}
