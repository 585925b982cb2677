/*
 * driver.h -- the driver of the DOCA *test model* (see model.h; not NVIDIA
 * DOCA): exercises the model through its public API, linked directly against
 * the four model libraries (doca/model/check.sh builds driver_*.c and runs
 * it). Prints PASS/FAIL per scenario and exits non-zero if any scenario fails.
 *
 * The prototypes come from model.h itself (MODEL_DECLS_ONLY), so the driver
 * and the model cannot disagree on a signature.
 *
 * Files: driver_main.c (harness, shared helpers, main), driver_basic.c
 * (scenarios 1, 6, 7), driver_dma.c (2, 3, 5), driver_crypto.c (4),
 * driver_process.c (8).
 */
#ifndef DOCA_MODEL_DRIVER_H
#define DOCA_MODEL_DRIVER_H

#define MODEL_DECLS_ONLY
#include "model.h"

#include <errno.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- tiny test harness (driver_main.c) ---- */

extern int g_failed; /* failures in the current scenario */

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "    check failed at %s:%d: %s\n", __FILE__, __LINE__, \
				#cond);                                                    \
			g_failed++;                                                        \
		}                                                                          \
	} while (0)

/* Expect a doca_error_t. */
#define CHECK_RC(expr, want)                                                                           \
	do {                                                                                           \
		doca_error_t rc_ = (expr);                                                             \
		if (rc_ != (want)) {                                                                   \
			fprintf(stderr, "    %s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, \
				#expr, doca_error_get_name(rc_), doca_error_get_name(want));            \
			g_failed++;                                                                    \
		}                                                                                      \
	} while (0)

#define OK(expr) CHECK_RC(expr, DOCA_SUCCESS)

/* ---- completion bookkeeping shared by the callbacks (driver_main.c) ---- */

struct completion {
	int ok;
	int err;
	doca_error_t status;
	void *task;
	union doca_data task_ud;
	union doca_data ctx_ud;
};

/* Completion callbacks: each records into the struct completion its task's
 * user data points to. */
void dma_ok_cb(struct doca_dma_task_memcpy *t, union doca_data tu, union doca_data cu);
void dma_err_cb(struct doca_dma_task_memcpy *t, union doca_data tu, union doca_data cu);
void enc_ok_cb(struct doca_aes_gcm_task_encrypt *t, union doca_data tu, union doca_data cu);
void enc_err_cb(struct doca_aes_gcm_task_encrypt *t, union doca_data tu, union doca_data cu);
void dec_ok_cb(struct doca_aes_gcm_task_decrypt *t, union doca_data tu, union doca_data cu);
void dec_err_cb(struct doca_aes_gcm_task_decrypt *t, union doca_data tu, union doca_data cu);

struct state_log {
	int n;
	enum doca_ctx_states prev[8], next[8];
};

/* Logs state changes into the struct state_log the context's user data points to. */
void state_cb(union doca_data ud, struct doca_ctx *ctx, enum doca_ctx_states prev, enum doca_ctx_states next);
/* Progress until nothing is left (bounded). */
int drain(struct doca_pe *pe);
/* The first device, opened (NULL if none). */
struct doca_dev *open_dev(void);
/* A started local mmap over [addr, addr+len). */
struct doca_mmap *local_mmap(struct doca_dev *dev, void *addr, size_t len, uint32_t perms);
/* n pseudo-random bytes from seed. */
void fill(uint8_t *p, size_t n, uint32_t seed);

/* ---- a DMA engine on a progress engine (driver_main.c) ---- */

struct dma_env {
	struct doca_pe *pe;
	struct doca_dma *dma;
	struct doca_ctx *ctx;
	struct state_log log;
};

int dma_env_up(struct dma_env *e, struct doca_dev *dev, uint32_t num_tasks);
void dma_env_down(struct dma_env *e);
/* One memcpy, run to completion. Returns the task's status (or the
 * submit failure) and fills *c. */
doca_error_t dma_copy(struct dma_env *e, struct doca_buf *src, struct doca_buf *dst, struct completion *c);

/* ---- the scenarios (main() runs them in this order) ---- */

void scenario_devices(void);            /* 1, driver_basic.c */
void scenario_export_import_dma(void);  /* 2, driver_dma.c */
void scenario_dma_no_room(void);        /* 3, driver_dma.c */
void scenario_aes_gcm(void);            /* 4, driver_crypto.c */
void scenario_export_errors(void);      /* 5, driver_dma.c */
void scenario_no_devices(void);         /* 6, driver_basic.c */
void scenario_core_state_machine(void); /* 7, driver_basic.c */
void scenario_cross_process(void);      /* 8, driver_process.c */

#endif /* DOCA_MODEL_DRIVER_H */
