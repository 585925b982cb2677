/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */

#include "model.h"

/* ========================================================================
 * libdoca_dma
 * ======================================================================== */

#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

struct doca_dma {
	uint32_t magic;
	struct doca_ctx *ctx;
};

struct model_dma_payload {
	const struct doca_buf *src;
	struct doca_buf *dst;
};

static int model_dma_is_valid(const struct doca_dma *dma)
{
	return dma != NULL && dma->magic == MAGIC_DMA;
}

static doca_error_t model_dma_can_start(void *impl)
{
	struct doca_dma *dma = impl;
	/* set_conf must have been called [brief]; the code is the model's
	 * ("invalid input" is what the reference lists for doca_ctx_start). */
	return model_ctx_task_configured(dma->ctx, 0) ? DOCA_SUCCESS : DOCA_ERROR_INVALID_VALUE;
}

/* Checks a memcpy; on success returns source bytes and destination append point. */
static doca_error_t model_dma_prepare(struct doca_dma *dma, const struct model_dma_payload *p, uint8_t **src,
				      size_t *n, uint8_t **dst)
{
	uint8_t *d;
	size_t dlen, room;
	if (model_buf_view(p->src, src, n, NULL) != DOCA_SUCCESS ||
	    model_buf_view(p->dst, &d, &dlen, &room) != DOCA_SUCCESS)
		return DOCA_ERROR_INVALID_VALUE; /* a buffer was returned meanwhile */
	const struct doca_dev *dev = model_ctx_dev(dma->ctx);
	doca_error_t rc = model_buf_check_access(p->src, dev, 0);
	if (rc == DOCA_SUCCESS)
		rc = model_buf_check_access(p->dst, dev, 1);
	if (rc != DOCA_SUCCESS)
		return rc;
	if ((uint64_t)*n > MODEL_DMA_MAX_BUF_SIZE)
		return DOCA_ERROR_INVALID_VALUE;
	/* Output goes after the destination's data; no room -> INVALID_VALUE [brief]. */
	if (*n > room)
		return DOCA_ERROR_INVALID_VALUE;
	*dst = d + dlen;
	return DOCA_SUCCESS;
}

static doca_error_t model_dma_validate(void *impl, struct doca_task *task, unsigned type, void *payload)
{
	uint8_t *s, *d;
	size_t n;
	MODEL_UNUSED(task);
	MODEL_UNUSED(type);
	return model_dma_prepare(impl, payload, &s, &n, &d);
}

/* ---- cross-process DMA ----
 *
 * A buffer in an mmap imported from ANOTHER process's PCI export holds
 * addresses of that process; the model never dereferences them. At progress
 * time the copy runs with process_vm_readv (foreign source) and/or
 * process_vm_writev (foreign destination); foreign to foreign goes through a
 * bounce buffer (read a chunk, write it, repeat). Short transfers are resumed
 * until every byte has moved or a call fails. A call that moves nothing is
 * treated like EFAULT, so the loop always ends.
 *
 * How a failed call maps to the task's status (delivered through the error
 * callback; the destination's data length is left unchanged, though bytes
 * after it may already have been written) [brief]/[model]:
 *   ESRCH          the exporting process is gone: exited, or a zombie whose
 *                  memory is released                  -> DOCA_ERROR_DRIVER
 *   EFAULT         the range (or part of it) is no longer mapped in the
 *                  exporter, e.g. it freed/unmapped it -> DOCA_ERROR_DRIVER
 *   EPERM, EACCES  the kernel refuses to reach the other process (another
 *                  uid, Yama ptrace_scope, seccomp)     -> DOCA_ERROR_NOT_PERMITTED
 *   ENOMEM         the kernel could not allocate        -> DOCA_ERROR_NO_MEMORY
 *   ENOSYS         kernel without cross-memory attach   -> DOCA_ERROR_NOT_SUPPORTED
 *   anything else  (EINVAL, ...)                        -> DOCA_ERROR_DRIVER
 * DRIVER stands for "the remote memory is gone": what real DOCA reports when
 * a host process dies under a DMA is not documented in the reference used for
 * the model, so tests must not read these codes as real DOCA's.
 *
 * Limitation: the owner is identified by pid only. If the exporter exits and
 * is reaped and the pid is reused by another process of the same user, a DMA
 * through the stale import reaches that process. Tests should do stale-import
 * DMAs before reaping the exporter (a zombie keeps its pid; ESRCH). */

#define MODEL_DMA_BOUNCE_CHUNK ((size_t)1 << 20)

static doca_error_t model_dma_errno(int err)
{
	switch (err) {
	case EPERM:
	case EACCES:
		return DOCA_ERROR_NOT_PERMITTED;
	case ENOMEM:
		return DOCA_ERROR_NO_MEMORY;
	case ENOSYS:
		return DOCA_ERROR_NOT_SUPPORTED;
	case ESRCH:
	case EFAULT:
	default:
		return DOCA_ERROR_DRIVER;
	}
}

/* Moves n bytes between local memory and address `remote` of process pid:
 * write = 0 reads remote -> local, write = 1 writes local -> remote. */
static doca_error_t model_dma_remote(pid_t pid, int write, uint8_t *local, uintptr_t remote, size_t n)
{
	size_t done = 0;
	while (done < n) {
		struct iovec l = { .iov_base = local + done, .iov_len = n - done };
		struct iovec r = { .iov_base = (void *)(remote + done), .iov_len = n - done };
		ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			return model_dma_errno(errno);
		}
		if (got == 0 || (size_t)got > n - done)
			return model_dma_errno(EFAULT); /* no progress: treat as unmapped */
		done += (size_t)got;
	}
	return DOCA_SUCCESS;
}

/* Copies n bytes from s to d; spid/dpid: the foreign owner of each side, or 0
 * for this process's memory. */
static doca_error_t model_dma_move(pid_t spid, uint8_t *s, pid_t dpid, uint8_t *d, size_t n)
{
	if (n == 0)
		return DOCA_SUCCESS;
	if (spid == 0 && dpid == 0) {
		memmove(d, s, n); /* may overlap */
		return DOCA_SUCCESS;
	}
	if (dpid == 0)
		return model_dma_remote(spid, 0, d, (uintptr_t)s, n);
	if (spid == 0)
		return model_dma_remote(dpid, 1, s, (uintptr_t)d, n);
	/* Foreign to foreign (the same or two processes): through a bounce
	 * buffer, one chunk at a time. Within one process with d above s the
	 * chunks go back to front, so overlapping ranges copy like memmove. */
	size_t chunk = n < MODEL_DMA_BOUNCE_CHUNK ? n : MODEL_DMA_BOUNCE_CHUNK;
	size_t nchunks = n / chunk + (n % chunk != 0);
	int backwards = spid == dpid && (uintptr_t)d > (uintptr_t)s;
	uint8_t *bounce = malloc(chunk);
	if (bounce == NULL)
		return DOCA_ERROR_NO_MEMORY;
	doca_error_t rc = DOCA_SUCCESS;
	for (size_t i = 0; i < nchunks && rc == DOCA_SUCCESS; i++) {
		size_t off = (backwards ? nchunks - 1 - i : i) * chunk;
		size_t m = n - off < chunk ? n - off : chunk;
		rc = model_dma_remote(spid, 0, bounce, (uintptr_t)s + off, m);
		if (rc == DOCA_SUCCESS)
			rc = model_dma_remote(dpid, 1, bounce, (uintptr_t)d + off, m);
	}
	free(bounce);
	return rc;
}

static doca_error_t model_dma_execute(void *impl, struct doca_task *task, unsigned type, void *payload)
{
	struct model_dma_payload *p = payload;
	uint8_t *s, *d;
	size_t n;
	MODEL_UNUSED(task);
	MODEL_UNUSED(type);
	doca_error_t rc = model_dma_prepare(impl, p, &s, &n, &d);
	if (rc != DOCA_SUCCESS)
		return rc;
	/* Same-process memory: memmove; foreign (imported from another
	 * process's PCI export): process_vm_readv/writev, see above. */
	rc = model_dma_move((pid_t)model_buf_foreign_pid(p->src), s, (pid_t)model_buf_foreign_pid(p->dst), d, n);
	if (rc != DOCA_SUCCESS)
		return rc;
	return model_buf_append(p->dst, n);
}

static const struct model_ctx_ops model_dma_ops = {
	.name = "dma",
	.can_start = model_dma_can_start,
	.validate = model_dma_validate,
	.execute = model_dma_execute,
};

MODEL_API doca_error_t doca_dma_create(struct doca_dev *dev, struct doca_dma **dma)
{
	if (!model_dev_is_valid(dev) || dma == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_dma *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return DOCA_ERROR_NO_MEMORY;
	doca_error_t rc = model_ctx_create(dev, &model_dma_ops, d, 1, &d->ctx);
	if (rc != DOCA_SUCCESS) {
		free(d);
		return rc;
	}
	d->magic = MAGIC_DMA;
	*dma = d;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_dma_destroy(struct doca_dma *dma)
{
	if (!model_dma_is_valid(dma))
		return DOCA_ERROR_INVALID_VALUE;
	doca_error_t rc = model_ctx_destroy(dma->ctx); /* BAD_STATE unless idle */
	if (rc != DOCA_SUCCESS)
		return rc;
	dma->magic = 0;
	free(dma);
	return DOCA_SUCCESS;
}

MODEL_API struct doca_ctx *doca_dma_as_ctx(struct doca_dma *dma)
{
	return model_dma_is_valid(dma) ? dma->ctx : NULL;
}

MODEL_API doca_error_t doca_dma_cap_task_memcpy_is_supported(const struct doca_devinfo *devinfo)
{
	return model_devinfo_is_valid(devinfo) ? DOCA_SUCCESS : DOCA_ERROR_INVALID_VALUE;
}

MODEL_API doca_error_t doca_dma_cap_task_memcpy_get_max_buf_size(const struct doca_devinfo *devinfo,
								 uint64_t *buf_size)
{
	if (!model_devinfo_is_valid(devinfo) || buf_size == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*buf_size = MODEL_DMA_MAX_BUF_SIZE; /* 2 GiB [brief] */
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_dma_task_memcpy_set_conf(struct doca_dma *dma,
						     doca_dma_task_memcpy_completion_cb_t task_completion_cb,
						     doca_dma_task_memcpy_completion_cb_t task_error_cb,
						     uint32_t num_memcpy_tasks)
{
	if (!model_dma_is_valid(dma))
		return DOCA_ERROR_INVALID_VALUE;
	return model_ctx_set_task_conf(dma->ctx, 0, (model_task_cb)task_completion_cb, (model_task_cb)task_error_cb,
				       num_memcpy_tasks);
}

MODEL_API doca_error_t doca_dma_task_memcpy_alloc_init(struct doca_dma *dma, const struct doca_buf *src,
						       struct doca_buf *dst, union doca_data user_data,
						       struct doca_dma_task_memcpy **task)
{
	if (!model_dma_is_valid(dma) || src == NULL || dst == NULL || task == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_task *t;
	void *payload;
	doca_error_t rc = model_task_alloc(dma->ctx, 0, sizeof(struct model_dma_payload), user_data, &t, &payload);
	if (rc != DOCA_SUCCESS)
		return rc;
	struct model_dma_payload *p = payload;
	p->src = src;
	p->dst = dst;
	*task = (struct doca_dma_task_memcpy *)t;
	return DOCA_SUCCESS;
}

MODEL_API struct doca_task *doca_dma_task_memcpy_as_task(struct doca_dma_task_memcpy *task)
{
	return (struct doca_task *)task; /* the same object */
}

MODEL_API const struct doca_buf *doca_dma_task_memcpy_get_src(const struct doca_dma_task_memcpy *task)
{
	const struct model_dma_payload *p =
		model_task_payload((const struct doca_task *)task, &model_dma_ops, 0);
	return p != NULL ? p->src : NULL;
}

MODEL_API struct doca_buf *doca_dma_task_memcpy_get_dst(const struct doca_dma_task_memcpy *task)
{
	const struct model_dma_payload *p =
		model_task_payload((const struct doca_task *)task, &model_dma_ops, 0);
	return p != NULL ? p->dst : NULL;
}
