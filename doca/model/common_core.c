/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */

#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/types.h>
#include <unistd.h>

/* ========================================================================
 * libdoca_common: progress engine, contexts, tasks, and the model_ctx_* /
 * model_task_* interface of the library parts (the rest of libdoca_common:
 * common_dev.c, common_mmap.c)
 * ======================================================================== */

/* ---- progress engine, contexts, tasks ---- */

struct model_task_type {
	model_task_cb completion_cb;
	model_task_cb error_cb;
	uint32_t num;
	uint32_t allocated;
	int configured;
};

struct doca_ctx {
	uint32_t magic;
	const struct model_ctx_ops *ops;
	void *impl;
	struct doca_dev *dev;
	struct doca_pe *pe;
	struct doca_ctx *pe_next;
	enum doca_ctx_states state;
	union doca_data user_data;
	doca_ctx_state_changed_callback_t state_cb;
	size_t inflight;  /* submitted, not completed */
	size_t allocated; /* allocated, not freed */
	unsigned n_types;
	struct model_task_type types[MODEL_MAX_TASK_TYPES];
};

struct doca_task {
	uint32_t magic;
	struct doca_ctx *ctx;
	unsigned type;
	int submitted;
	doca_error_t status;
	union doca_data user_data;
	struct doca_task *next; /* progress engine queue */
	max_align_t payload[];
};

struct doca_pe {
	uint32_t magic;
	int efd;
	struct doca_task *head, *tail; /* submitted tasks, FIFO */
	size_t inflight;
	struct doca_ctx *ctxs; /* connected contexts */
};

static int model_pe_is_valid(const struct doca_pe *pe)
{
	return pe != NULL && pe->magic == MAGIC_PE;
}

static int model_ctx_is_valid(const struct doca_ctx *ctx)
{
	return ctx != NULL && ctx->magic == MAGIC_CTX;
}

static int model_task_is_valid(const struct doca_task *task)
{
	return task != NULL && task->magic == MAGIC_TASK;
}

/* Makes the notification fd readable. */
static void model_pe_notify(struct doca_pe *pe)
{
	uint64_t one = 1;
	ssize_t r = write(pe->efd, &one, sizeof(one));
	MODEL_UNUSED(r); /* EAGAIN only if the counter is saturated: still readable */
}

static void model_ctx_set_state(struct doca_ctx *ctx, enum doca_ctx_states next)
{
	enum doca_ctx_states prev = ctx->state;
	ctx->state = next;
	if (ctx->state_cb != NULL)
		ctx->state_cb(ctx->user_data, ctx, prev, next);
}

/* A stopping context whose tasks are all back, i.e. ready to become idle. */
static struct doca_ctx *model_pe_ready_to_idle(const struct doca_pe *pe)
{
	for (struct doca_ctx *c = pe->ctxs; c != NULL; c = c->pe_next)
		if (c->state == DOCA_CTX_STATE_STOPPING && c->allocated == 0)
			return c;
	return NULL;
}

MODEL_API doca_error_t doca_pe_create(struct doca_pe **pe)
{
	if (pe == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_pe *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return DOCA_ERROR_NO_MEMORY;
	p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (p->efd < 0) {
		free(p);
		return DOCA_ERROR_OPERATING_SYSTEM;
	}
	p->magic = MAGIC_PE;
	*pe = p;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_pe_destroy(struct doca_pe *pe)
{
	if (!model_pe_is_valid(pe))
		return DOCA_ERROR_INVALID_VALUE;
	/* Contexts still connected (so also any in-flight task) [doc]. */
	if (pe->ctxs != NULL || pe->inflight > 0)
		return DOCA_ERROR_IN_USE;
	close(pe->efd);
	pe->magic = 0;
	free(pe);
	return DOCA_SUCCESS;
}

/* Completes ONE queued task per call, else makes ONE stopping context idle.
 * Returns 1 if it did something [doc]/[brief]. */
MODEL_API uint8_t doca_pe_progress(struct doca_pe *pe)
{
	if (!model_pe_is_valid(pe))
		return 0;
	struct doca_task *t = pe->head;
	if (t != NULL) {
		pe->head = t->next;
		if (pe->head == NULL)
			pe->tail = NULL;
		t->next = NULL;
		t->submitted = 0;
		pe->inflight--;
		struct doca_ctx *ctx = t->ctx;
		ctx->inflight--;
		/* A stopping context drains its queue: the model runs the task
		 * (the reference allows "flushed or drained"). */
		doca_error_t st = ctx->ops->execute(ctx->impl, t, t->type, t->payload);
		t->status = st;
		const struct model_task_type *tt = &ctx->types[t->type];
		model_task_cb cb = st == DOCA_SUCCESS ? tt->completion_cb : tt->error_cb;
		/* The callback may free or resubmit the task, or stop the context:
		 * nothing is touched after it. */
		cb(t, t->user_data, ctx->user_data);
		return 1;
	}
	struct doca_ctx *c = model_pe_ready_to_idle(pe);
	if (c != NULL) {
		model_ctx_set_state(c, DOCA_CTX_STATE_IDLE);
		return 1;
	}
	return 0;
}

MODEL_API doca_error_t doca_pe_connect_ctx(struct doca_pe *pe, struct doca_ctx *ctx)
{
	if (!model_pe_is_valid(pe) || !model_ctx_is_valid(ctx))
		return DOCA_ERROR_INVALID_VALUE;
	if (ctx->pe != NULL)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc]: already connected */
	if (ctx->state != DOCA_CTX_STATE_IDLE)
		return DOCA_ERROR_BAD_STATE; /* [doc] */
	ctx->pe = pe;
	ctx->pe_next = pe->ctxs;
	pe->ctxs = ctx;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_pe_get_num_inflight_tasks(const struct doca_pe *pe, size_t *num_inflight_tasks)
{
	if (!model_pe_is_valid(pe) || num_inflight_tasks == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*num_inflight_tasks = pe->inflight;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_pe_get_notification_handle(const struct doca_pe *pe,
						       doca_notification_handle_t *handle)
{
	if (!model_pe_is_valid(pe) || handle == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*handle = pe->efd;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_pe_request_notification(struct doca_pe *pe)
{
	if (!model_pe_is_valid(pe))
		return DOCA_ERROR_INVALID_VALUE;
	/* In the model every submitted task is complete at once, so arming
	 * with work pending fires immediately (as a completion arriving right
	 * after arming would). Submits also write the fd [brief]. */
	if (pe->head != NULL || model_pe_ready_to_idle(pe) != NULL)
		model_pe_notify(pe);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_pe_clear_notification(struct doca_pe *pe, doca_notification_handle_t handle)
{
	if (!model_pe_is_valid(pe) || handle != pe->efd)
		return DOCA_ERROR_INVALID_VALUE;
	uint64_t v;
	for (;;) { /* drain the eventfd [brief] */
		ssize_t r = read(pe->efd, &v, sizeof(v));
		if (r == (ssize_t)sizeof(v))
			continue;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return DOCA_ERROR_OPERATING_SYSTEM; /* [doc] */
		return DOCA_SUCCESS;
	}
}

static doca_error_t model_task_enqueue(struct doca_task *task, int validate)
{
	if (!model_task_is_valid(task))
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_ctx *ctx = task->ctx;
	if (task->submitted)
		return DOCA_ERROR_BAD_STATE; /* already submitted [model] */
	if (ctx->state != DOCA_CTX_STATE_RUNNING || ctx->pe == NULL)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	if (validate && ctx->ops->validate != NULL) {
		/* try_submit validates; an invalid task is not submitted [doc]. */
		doca_error_t rc = ctx->ops->validate(ctx->impl, task, task->type, task->payload);
		if (rc != DOCA_SUCCESS)
			return rc;
	}
	struct doca_pe *pe = ctx->pe;
	task->submitted = 1;
	task->status = DOCA_SUCCESS;
	task->next = NULL;
	if (pe->tail != NULL)
		pe->tail->next = task;
	else
		pe->head = task;
	pe->tail = task;
	pe->inflight++;
	ctx->inflight++;
	model_pe_notify(pe); /* [brief] */
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_task_submit(struct doca_task *task)
{
	return model_task_enqueue(task, 0);
}

MODEL_API doca_error_t doca_task_try_submit(struct doca_task *task)
{
	return model_task_enqueue(task, 1);
}

MODEL_API void doca_task_free(struct doca_task *task)
{
	if (!model_task_is_valid(task))
		return;
	if (task->submitted) {
		/* Freeing a submitted task is a caller bug; keep it queued. */
		fprintf(stderr, "doca model: doca_task_free on a submitted task %p ignored\n", (void *)task);
		return;
	}
	struct doca_ctx *ctx = task->ctx;
	ctx->types[task->type].allocated--;
	ctx->allocated--;
	task->magic = 0;
	free(task);
	/* The last task of a stopping context: idle on the next progress. */
	if (ctx->state == DOCA_CTX_STATE_STOPPING && ctx->allocated == 0 && ctx->pe != NULL)
		model_pe_notify(ctx->pe);
}

MODEL_API doca_error_t doca_task_get_status(const struct doca_task *task)
{
	if (!model_task_is_valid(task))
		return DOCA_ERROR_INVALID_VALUE;
	return task->status;
}

MODEL_API void doca_task_set_user_data(struct doca_task *task, union doca_data user_data)
{
	if (model_task_is_valid(task))
		task->user_data = user_data;
}

MODEL_API union doca_data doca_task_get_user_data(const struct doca_task *task)
{
	union doca_data none = { .u64 = 0 };
	return model_task_is_valid(task) ? task->user_data : none;
}

MODEL_API doca_error_t doca_ctx_start(struct doca_ctx *ctx)
{
	if (!model_ctx_is_valid(ctx))
		return DOCA_ERROR_INVALID_VALUE;
	if (ctx->state != DOCA_CTX_STATE_IDLE)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	if (ctx->pe == NULL)
		return DOCA_ERROR_NOT_CONNECTED; /* [doc] */
	if (ctx->ops->can_start != NULL) {
		doca_error_t rc = ctx->ops->can_start(ctx->impl);
		if (rc != DOCA_SUCCESS)
			return rc;
	}
	/* Synchronous start: straight to RUNNING, callback IDLE -> RUNNING. */
	model_ctx_set_state(ctx, DOCA_CTX_STATE_RUNNING);
	return DOCA_SUCCESS;
}

/* [doc]: with tasks outstanding, stop returns DOCA_ERROR_IN_PROGRESS and the
 * context moves to STOPPING; the progress engine drains it and makes it IDLE
 * (state-changed callback) once every task has been completed AND freed ("all
 * tasks MUST be freed in order for a context to be stopped"). Without tasks
 * it goes straight to IDLE and stop returns DOCA_SUCCESS. */
MODEL_API doca_error_t doca_ctx_stop(struct doca_ctx *ctx)
{
	if (!model_ctx_is_valid(ctx))
		return DOCA_ERROR_INVALID_VALUE;
	switch (ctx->state) {
	case DOCA_CTX_STATE_IDLE:
		return DOCA_ERROR_BAD_STATE; /* not started [model] */
	case DOCA_CTX_STATE_STOPPING:
		return DOCA_ERROR_IN_PROGRESS;
	default:
		break;
	}
	if (ctx->allocated == 0) {
		model_ctx_set_state(ctx, DOCA_CTX_STATE_IDLE);
		return DOCA_SUCCESS;
	}
	model_ctx_set_state(ctx, DOCA_CTX_STATE_STOPPING);
	if (ctx->pe != NULL)
		model_pe_notify(ctx->pe);
	return DOCA_ERROR_IN_PROGRESS;
}

MODEL_API doca_error_t doca_ctx_get_state(const struct doca_ctx *ctx, enum doca_ctx_states *state)
{
	if (!model_ctx_is_valid(ctx) || state == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*state = ctx->state;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_ctx_set_user_data(struct doca_ctx *ctx, union doca_data user_data)
{
	if (!model_ctx_is_valid(ctx))
		return DOCA_ERROR_INVALID_VALUE;
	ctx->user_data = user_data;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_ctx_get_num_inflight_tasks(const struct doca_ctx *ctx, size_t *num_inflight_tasks)
{
	if (!model_ctx_is_valid(ctx) || num_inflight_tasks == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*num_inflight_tasks = ctx->inflight;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_ctx_set_state_changed_cb(struct doca_ctx *ctx, doca_ctx_state_changed_callback_t cb)
{
	if (!model_ctx_is_valid(ctx))
		return DOCA_ERROR_INVALID_VALUE;
	ctx->state_cb = cb;
	return DOCA_SUCCESS;
}

/* ---- model internal interface for the library parts ---- */

MODEL_API doca_error_t model_ctx_create(struct doca_dev *dev, const struct model_ctx_ops *ops, void *impl,
					unsigned n_task_types, struct doca_ctx **ctx)
{
	if (!model_dev_is_valid(dev) || ops == NULL || ops->execute == NULL || ctx == NULL ||
	    n_task_types == 0 || n_task_types > MODEL_MAX_TASK_TYPES)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_ctx *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return DOCA_ERROR_NO_MEMORY;
	c->magic = MAGIC_CTX;
	c->ops = ops;
	c->impl = impl;
	c->dev = dev;
	c->state = DOCA_CTX_STATE_IDLE;
	c->n_types = n_task_types;
	dev->users++;
	*ctx = c;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t model_ctx_destroy(struct doca_ctx *ctx)
{
	if (!model_ctx_is_valid(ctx))
		return DOCA_ERROR_INVALID_VALUE;
	if (ctx->state != DOCA_CTX_STATE_IDLE)
		return DOCA_ERROR_BAD_STATE; /* [doc] (AES-GCM destroy) */
	if (ctx->pe != NULL) {
		/* Destroying the context breaks the connection [doc]. */
		struct doca_ctx **pp = &ctx->pe->ctxs;
		while (*pp != NULL && *pp != ctx)
			pp = &(*pp)->pe_next;
		if (*pp == ctx)
			*pp = ctx->pe_next;
	}
	ctx->dev->users--;
	ctx->magic = 0;
	free(ctx);
	return DOCA_SUCCESS;
}

MODEL_API struct doca_dev *model_ctx_dev(const struct doca_ctx *ctx)
{
	return model_ctx_is_valid(ctx) ? ctx->dev : NULL;
}

MODEL_API doca_error_t model_ctx_set_task_conf(struct doca_ctx *ctx, unsigned type, model_task_cb completion_cb,
					       model_task_cb error_cb, uint32_t num_tasks)
{
	if (!model_ctx_is_valid(ctx) || type >= ctx->n_types || completion_cb == NULL || error_cb == NULL ||
	    num_tasks == 0)
		return DOCA_ERROR_INVALID_VALUE; /* [doc] */
	if (ctx->state != DOCA_CTX_STATE_IDLE)
		return DOCA_ERROR_BAD_STATE; /* [doc] */
	struct model_task_type *tt = &ctx->types[type];
	tt->completion_cb = completion_cb;
	tt->error_cb = error_cb;
	tt->num = num_tasks;
	tt->configured = 1;
	return DOCA_SUCCESS;
}

MODEL_API int model_ctx_task_configured(const struct doca_ctx *ctx, unsigned type)
{
	return model_ctx_is_valid(ctx) && type < ctx->n_types && ctx->types[type].configured;
}

MODEL_API doca_error_t model_task_alloc(struct doca_ctx *ctx, unsigned type, size_t payload_size,
					union doca_data user_data, struct doca_task **task, void **payload)
{
	if (!model_ctx_is_valid(ctx) || type >= ctx->n_types || task == NULL || payload == NULL ||
	    payload_size > SIZE_MAX / 2)
		return DOCA_ERROR_INVALID_VALUE;
	if (ctx->state != DOCA_CTX_STATE_RUNNING)
		return DOCA_ERROR_BAD_STATE; /* [doc] */
	struct model_task_type *tt = &ctx->types[type];
	if (!tt->configured || tt->allocated >= tt->num)
		return DOCA_ERROR_NO_MEMORY; /* [doc]: all tasks allocated */
	struct doca_task *t = calloc(1, sizeof(*t) + payload_size);
	if (t == NULL)
		return DOCA_ERROR_NO_MEMORY;
	t->magic = MAGIC_TASK;
	t->ctx = ctx;
	t->type = type;
	t->status = DOCA_SUCCESS;
	t->user_data = user_data;
	tt->allocated++;
	ctx->allocated++;
	*task = t;
	*payload = t->payload;
	return DOCA_SUCCESS;
}

MODEL_API void *model_task_payload(const struct doca_task *task, const struct model_ctx_ops *ops, unsigned type)
{
	if (!model_task_is_valid(task) || task->ctx->ops != ops || task->type != type)
		return NULL;
	return (void *)task->payload;
}
