/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */
/* Driver of the model: test harness, helpers shared by the scenarios, main (see driver.h) */

#include "driver.h"

/* ---- tiny test harness ---- */

int g_failed; /* failures in the current scenario */

static void report(int *total_failed, int n, const char *name)
{
	printf("%s scenario %d: %s\n", g_failed ? "FAIL" : "PASS", n, name);
	fflush(stdout);
	if (g_failed)
		(*total_failed)++;
	g_failed = 0;
}

/* ---- completion bookkeeping shared by the callbacks ---- */

static void record(struct completion *c, int ok, struct doca_task *task, union doca_data task_ud,
		   union doca_data ctx_ud)
{
	if (ok)
		c->ok++;
	else
		c->err++;
	c->status = doca_task_get_status(task);
	c->task = task;
	c->task_ud = task_ud;
	c->ctx_ud = ctx_ud;
}

void dma_ok_cb(struct doca_dma_task_memcpy *t, union doca_data tu, union doca_data cu)
{
	record(tu.ptr, 1, doca_dma_task_memcpy_as_task(t), tu, cu);
}

void dma_err_cb(struct doca_dma_task_memcpy *t, union doca_data tu, union doca_data cu)
{
	record(tu.ptr, 0, doca_dma_task_memcpy_as_task(t), tu, cu);
}

void enc_ok_cb(struct doca_aes_gcm_task_encrypt *t, union doca_data tu, union doca_data cu)
{
	record(tu.ptr, 1, doca_aes_gcm_task_encrypt_as_task(t), tu, cu);
}

void enc_err_cb(struct doca_aes_gcm_task_encrypt *t, union doca_data tu, union doca_data cu)
{
	record(tu.ptr, 0, doca_aes_gcm_task_encrypt_as_task(t), tu, cu);
}

void dec_ok_cb(struct doca_aes_gcm_task_decrypt *t, union doca_data tu, union doca_data cu)
{
	record(tu.ptr, 1, doca_aes_gcm_task_decrypt_as_task(t), tu, cu);
}

void dec_err_cb(struct doca_aes_gcm_task_decrypt *t, union doca_data tu, union doca_data cu)
{
	record(tu.ptr, 0, doca_aes_gcm_task_decrypt_as_task(t), tu, cu);
}

void state_cb(union doca_data ud, struct doca_ctx *ctx, enum doca_ctx_states prev, enum doca_ctx_states next)
{
	struct state_log *l = ud.ptr;
	(void)ctx;
	if (l != NULL && l->n < 8) {
		l->prev[l->n] = prev;
		l->next[l->n] = next;
		l->n++;
	}
}

/* Progress until nothing is left (bounded). */
int drain(struct doca_pe *pe)
{
	int n = 0;
	while (doca_pe_progress(pe) && n < 1000)
		n++;
	return n;
}

struct doca_dev *open_dev(void)
{
	struct doca_devinfo **list = NULL;
	uint32_t n = 0;
	struct doca_dev *dev = NULL;
	if (doca_devinfo_create_list(&list, &n) != DOCA_SUCCESS || n < 1)
		return NULL;
	if (doca_dev_open(list[0], &dev) != DOCA_SUCCESS)
		dev = NULL;
	doca_devinfo_destroy_list(list);
	return dev;
}

/* A started local mmap over [addr, addr+len). */
struct doca_mmap *local_mmap(struct doca_dev *dev, void *addr, size_t len, uint32_t perms)
{
	struct doca_mmap *m = NULL;
	if (doca_mmap_create(&m) != DOCA_SUCCESS)
		return NULL;
	if (doca_mmap_set_memrange(m, addr, len) != DOCA_SUCCESS || doca_mmap_set_permissions(m, perms) != DOCA_SUCCESS ||
	    doca_mmap_add_dev(m, dev) != DOCA_SUCCESS || doca_mmap_start(m) != DOCA_SUCCESS) {
		doca_mmap_destroy(m);
		return NULL;
	}
	return m;
}

void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (uint8_t)(seed >> 16);
	}
}

/* ---- a DMA engine on a progress engine ---- */

int dma_env_up(struct dma_env *e, struct doca_dev *dev, uint32_t num_tasks)
{
	memset(e, 0, sizeof(*e));
	if (doca_pe_create(&e->pe) != DOCA_SUCCESS || doca_dma_create(dev, &e->dma) != DOCA_SUCCESS)
		return 0;
	e->ctx = doca_dma_as_ctx(e->dma);
	union doca_data ud = { .ptr = &e->log };
	return e->ctx != NULL && doca_ctx_set_user_data(e->ctx, ud) == DOCA_SUCCESS &&
	       doca_ctx_set_state_changed_cb(e->ctx, state_cb) == DOCA_SUCCESS &&
	       doca_dma_task_memcpy_set_conf(e->dma, dma_ok_cb, dma_err_cb, num_tasks) == DOCA_SUCCESS &&
	       doca_pe_connect_ctx(e->pe, e->ctx) == DOCA_SUCCESS && doca_ctx_start(e->ctx) == DOCA_SUCCESS;
}

void dma_env_down(struct dma_env *e)
{
	if (e->ctx != NULL) {
		doca_error_t rc = doca_ctx_stop(e->ctx);
		if (rc == DOCA_ERROR_IN_PROGRESS)
			drain(e->pe);
	}
	OK(doca_dma_destroy(e->dma));
	OK(doca_pe_destroy(e->pe));
}

/* One memcpy, run to completion. Returns the task's status (or the
 * submit failure) and fills *c. */
doca_error_t dma_copy(struct dma_env *e, struct doca_buf *src, struct doca_buf *dst, struct completion *c)
{
	struct doca_dma_task_memcpy *t = NULL;
	union doca_data ud = { .ptr = c };
	memset(c, 0, sizeof(*c));
	doca_error_t rc = doca_dma_task_memcpy_alloc_init(e->dma, src, dst, ud, &t);
	if (rc != DOCA_SUCCESS)
		return rc;
	CHECK(doca_dma_task_memcpy_get_src(t) == src && doca_dma_task_memcpy_get_dst(t) == dst);
	rc = doca_task_submit(doca_dma_task_memcpy_as_task(t));
	if (rc != DOCA_SUCCESS) {
		doca_task_free(doca_dma_task_memcpy_as_task(t));
		return rc;
	}
	size_t inflight = 0;
	OK(doca_pe_get_num_inflight_tasks(e->pe, &inflight));
	CHECK(inflight == 1);
	CHECK(doca_pe_progress(e->pe) == 1);
	CHECK(c->ok + c->err == 1);
	CHECK(c->task == doca_dma_task_memcpy_as_task(t));
	CHECK(c->ctx_ud.ptr == &e->log);
	rc = doca_task_get_status(doca_dma_task_memcpy_as_task(t));
	doca_task_free(doca_dma_task_memcpy_as_task(t));
	return rc;
}

int main(void)
{
	int failed = 0;
	unsetenv("SLUICE_DOCA_MODEL_DEVICES");
	unsetenv("SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY");
	scenario_devices();
	report(&failed, 1, "device list/open, PCI address, ibdev name (plus absent representors, Comch, RDMA bridge)");
	scenario_export_import_dma();
	report(&failed, 2, "PCI export, create_from_export, DMA 4096 bytes into the import at offset 1000 and back");
	scenario_dma_no_room();
	report(&failed, 3, "DMA into a destination without room fails via the error callback (INVALID_VALUE)");
	scenario_aes_gcm();
	report(&failed, 4, "AES-256-GCM encrypt (36-byte AAD, 12-byte IV) matches OpenSSL, decrypt round trip, tamper fails");
	scenario_export_errors();
	report(&failed, 5, "export_pci without PCI permission NOT_PERMITTED, corrupted descriptor INVALID_VALUE");
	scenario_no_devices();
	report(&failed, 6, "SLUICE_DOCA_MODEL_DEVICES=0 gives an empty device list");
	scenario_core_state_machine();
	report(&failed, 7, "progress engine, notification fd, context stop/drain state machine, task pool");
	scenario_cross_process();
	report(&failed, 8,
	       "PCI export in a child process, import in the parent, DMA 64 KiB out of and into the child "
	       "(process_vm_readv/writev), EFAULT and stale import fail with DRIVER, AES-GCM NOT_SUPPORTED");
	printf("%s: %d scenario(s) failed\n", failed ? "FAIL" : "PASS", failed);
	return failed ? 1 : 0;
}
