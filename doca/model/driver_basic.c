/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */
/* Driver scenarios 1, 6, 7: devices, no devices, progress engine and contexts (see driver.h) */

#include "driver.h"

/* ---- scenario 1: devices ---- */

void scenario_devices(void)
{
	struct doca_devinfo **list = NULL;
	uint32_t n = 0;
	char pci[DOCA_DEVINFO_PCI_ADDR_SIZE];
	char ib[DOCA_DEVINFO_IBDEV_NAME_SIZE];
	uint8_t eq = 9;

	OK(doca_devinfo_create_list(&list, &n));
	CHECK(n == 1);
	if (n != 1)
		return;
	OK(doca_devinfo_get_pci_addr_str(list[0], pci));
	CHECK(strcmp(pci, "0000:03:00.0") == 0);
	OK(doca_devinfo_get_ibdev_name(list[0], ib, sizeof(ib)));
	CHECK(strcmp(ib, "mlx5_0") == 0);
	CHECK_RC(doca_devinfo_get_ibdev_name(list[0], ib, 3), DOCA_ERROR_INVALID_VALUE);
	OK(doca_devinfo_is_equal_pci_addr(list[0], "0000:03:00.0", &eq));
	CHECK(eq == 1);
	eq = 9;
	OK(doca_devinfo_is_equal_pci_addr(list[0], "03:00.0", &eq));
	CHECK(eq == 1);
	OK(doca_devinfo_is_equal_pci_addr(list[0], "0000:03:00.1", &eq));
	CHECK(eq == 0);
	CHECK_RC(doca_devinfo_is_equal_pci_addr(list[0], "mlx5_0", &eq), DOCA_ERROR_INVALID_VALUE);

	uint8_t cap = 0;
	OK(doca_mmap_cap_is_export_pci_supported(list[0], &cap));
	CHECK(cap == 1);
	cap = 0;
	OK(doca_mmap_cap_is_create_from_export_pci_supported(list[0], &cap));
	CHECK(cap == 1);
	OK(doca_dma_cap_task_memcpy_is_supported(list[0]));
	uint64_t max = 0;
	OK(doca_dma_cap_task_memcpy_get_max_buf_size(list[0], &max));
	CHECK(max == (UINT64_C(2) << 30));
	OK(doca_aes_gcm_cap_task_encrypt_is_supported(list[0]));
	OK(doca_aes_gcm_cap_task_decrypt_is_supported(list[0]));
	CHECK_RC(doca_comch_cap_client_is_supported(list[0]), DOCA_ERROR_NOT_SUPPORTED);

	struct doca_dev *dev = NULL;
	OK(doca_dev_open(list[0], &dev));
	struct doca_devinfo *info0 = list[0];
	OK(doca_devinfo_destroy_list(list));
	CHECK(dev != NULL && doca_dev_as_devinfo(dev) == info0);
	/* The devinfo outlives the list while the device is open. */
	memset(pci, 0, sizeof(pci));
	OK(doca_devinfo_get_pci_addr_str(doca_dev_as_devinfo(dev), pci));
	CHECK(strcmp(pci, "0000:03:00.0") == 0);

	/* Representors: none. */
	struct doca_devinfo_rep **reps = NULL;
	uint32_t nreps = 7;
	OK(doca_devinfo_rep_create_list(dev, 0, &reps, &nreps));
	CHECK(nreps == 0 && reps != NULL);
	OK(doca_devinfo_rep_destroy_list(reps));
	struct doca_dev_rep *rep = (void *)1;
	CHECK_RC(doca_dev_rep_open(NULL, &rep), DOCA_ERROR_NOT_FOUND);
	CHECK(rep == NULL);

	/* Comch and the RDMA bridge are absent. */
	struct doca_comch_client *client = (void *)1;
	CHECK_RC(doca_comch_client_create(dev, "sluice", &client), DOCA_ERROR_NOT_SUPPORTED);
	CHECK(client == NULL);
	struct doca_comch_server *server = (void *)1;
	CHECK_RC(doca_comch_server_create(dev, NULL, "sluice", &server), DOCA_ERROR_NOT_SUPPORTED);
	struct ibv_pd *pd = (void *)1;
	CHECK_RC(doca_rdma_bridge_get_dev_pd(dev, &pd), DOCA_ERROR_NOT_SUPPORTED);
	struct doca_dev *dev2 = (void *)1;
	CHECK_RC(doca_rdma_bridge_open_dev_from_pd(NULL, &dev2), DOCA_ERROR_NOT_SUPPORTED);

	/* Error names. */
	CHECK(strcmp(doca_error_get_name(DOCA_ERROR_NOT_FOUND), "DOCA_ERROR_NOT_FOUND") == 0);
	CHECK(strcmp(doca_error_get_name(DOCA_SUCCESS), "DOCA_SUCCESS") == 0);
	CHECK(strcmp(doca_error_get_name(DOCA_ERROR_CONNECTION_INPROGRESS), "DOCA_ERROR_CONNECTION_INPROGRESS") == 0);
	CHECK(strcmp(doca_error_get_name(DOCA_ERROR_SKIPPED), "DOCA_ERROR_SKIPPED") == 0);
	CHECK(doca_error_get_name((doca_error_t)4242) != NULL && doca_error_get_descr((doca_error_t)4242) != NULL);
	for (unsigned e = 0; e <= 30; e++)
		CHECK(doca_error_get_descr((doca_error_t)e) != NULL && doca_error_get_descr((doca_error_t)e)[0] != 0);

	OK(doca_dev_close(dev));
}

/* ---- scenario 6: no devices ---- */

void scenario_no_devices(void)
{
	struct doca_devinfo **list = NULL;
	uint32_t n = 99;
	setenv("SLUICE_DOCA_MODEL_DEVICES", "0", 1);
	OK(doca_devinfo_create_list(&list, &n));
	CHECK(n == 0 && list != NULL && list[0] == NULL);
	OK(doca_devinfo_destroy_list(list));
	unsetenv("SLUICE_DOCA_MODEL_DEVICES");
	OK(doca_devinfo_create_list(&list, &n));
	CHECK(n == 1);
	OK(doca_devinfo_destroy_list(list));
}

/* ---- scenario 7: progress engine and context state machine ---- */

void scenario_core_state_machine(void)
{
	struct doca_dev *dev = open_dev();
	CHECK(dev != NULL);
	if (dev == NULL)
		return;
	uint8_t *mem = calloc(1, 8192);
	struct doca_mmap *m = local_mmap(dev, mem, 8192, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
	struct doca_buf_inventory *inv = NULL;
	OK(doca_buf_inventory_create(2, &inv));
	OK(doca_buf_inventory_start(inv));
	struct doca_buf *src = NULL, *dst = NULL;
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem, 16, mem, 16, &src));
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 4096, 4096, mem + 4096, 0, &dst));

	struct doca_pe *pe = NULL;
	struct doca_dma *dma = NULL;
	OK(doca_pe_create(&pe));
	OK(doca_dma_create(dev, &dma));
	struct doca_ctx *ctx = doca_dma_as_ctx(dma);
	struct state_log log = { 0 };
	union doca_data lud = { .ptr = &log };
	OK(doca_ctx_set_user_data(ctx, lud));
	OK(doca_ctx_set_state_changed_cb(ctx, state_cb));
	CHECK_RC(doca_ctx_start(ctx), DOCA_ERROR_NOT_CONNECTED);
	OK(doca_pe_connect_ctx(pe, ctx));
	CHECK_RC(doca_pe_connect_ctx(pe, ctx), DOCA_ERROR_NOT_PERMITTED);
	CHECK_RC(doca_ctx_start(ctx), DOCA_ERROR_INVALID_VALUE); /* no set_conf */
	OK(doca_dma_task_memcpy_set_conf(dma, dma_ok_cb, dma_err_cb, 2));
	CHECK_RC(doca_ctx_stop(ctx), DOCA_ERROR_BAD_STATE);
	OK(doca_ctx_start(ctx));
	enum doca_ctx_states st;
	OK(doca_ctx_get_state(ctx, &st));
	CHECK(st == DOCA_CTX_STATE_RUNNING);
	CHECK_RC(doca_dma_task_memcpy_set_conf(dma, dma_ok_cb, dma_err_cb, 4), DOCA_ERROR_BAD_STATE);

	/* Pool of 2. */
	struct completion c1 = { 0 }, c2 = { 0 };
	union doca_data u1 = { .ptr = &c1 }, u2 = { .ptr = &c2 };
	struct doca_dma_task_memcpy *t1 = NULL, *t2 = NULL, *t3 = NULL;
	OK(doca_dma_task_memcpy_alloc_init(dma, src, dst, u1, &t1));
	OK(doca_dma_task_memcpy_alloc_init(dma, src, dst, u2, &t2));
	CHECK_RC(doca_dma_task_memcpy_alloc_init(dma, src, dst, u1, &t3), DOCA_ERROR_NO_MEMORY);
	CHECK(doca_task_get_user_data(doca_dma_task_memcpy_as_task(t2)).ptr == &c2);

	/* Notification fd: readable after submit, drained by clear. */
	doca_notification_handle_t fd = -1;
	OK(doca_pe_get_notification_handle(pe, &fd));
	CHECK(fd >= 0);
	OK(doca_pe_request_notification(pe));
	OK(doca_pe_clear_notification(pe, fd));
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0);
	OK(doca_task_submit(doca_dma_task_memcpy_as_task(t1)));
	OK(doca_task_submit(doca_dma_task_memcpy_as_task(t2)));
	CHECK_RC(doca_task_submit(doca_dma_task_memcpy_as_task(t2)), DOCA_ERROR_BAD_STATE);
	CHECK(poll(&pfd, 1, 0) == 1);
	OK(doca_pe_clear_notification(pe, fd));
	CHECK(poll(&pfd, 1, 0) == 0);
	OK(doca_pe_request_notification(pe)); /* work pending: fires at once */
	CHECK(poll(&pfd, 1, 0) == 1);
	OK(doca_pe_clear_notification(pe, fd));

	size_t n = 0;
	OK(doca_ctx_get_num_inflight_tasks(ctx, &n));
	CHECK(n == 2);
	CHECK_RC(doca_pe_destroy(pe), DOCA_ERROR_IN_USE);

	/* Stop with tasks out: IN_PROGRESS, STOPPING; progress drains (one
	 * task per call), IDLE once all are freed. */
	CHECK_RC(doca_ctx_stop(ctx), DOCA_ERROR_IN_PROGRESS);
	OK(doca_ctx_get_state(ctx, &st));
	CHECK(st == DOCA_CTX_STATE_STOPPING);
	CHECK_RC(doca_task_submit(doca_dma_task_memcpy_as_task(t1)), DOCA_ERROR_BAD_STATE); /* still queued */
	CHECK(doca_pe_progress(pe) == 1 && c1.ok == 1 && c2.ok == 0);
	CHECK(doca_pe_progress(pe) == 1 && c2.ok == 1);
	OK(doca_ctx_get_num_inflight_tasks(ctx, &n));
	CHECK(n == 0);
	CHECK(doca_pe_progress(pe) == 0); /* tasks not freed yet: still stopping */
	OK(doca_ctx_get_state(ctx, &st));
	CHECK(st == DOCA_CTX_STATE_STOPPING);
	CHECK_RC(doca_dma_destroy(dma), DOCA_ERROR_BAD_STATE);
	doca_task_free(doca_dma_task_memcpy_as_task(t1));
	doca_task_free(doca_dma_task_memcpy_as_task(t2));
	CHECK(doca_pe_progress(pe) == 1);
	OK(doca_ctx_get_state(ctx, &st));
	CHECK(st == DOCA_CTX_STATE_IDLE);
	CHECK(doca_pe_progress(pe) == 0);
	CHECK(log.n == 3 && log.next[0] == DOCA_CTX_STATE_RUNNING && log.next[1] == DOCA_CTX_STATE_STOPPING &&
	      log.next[2] == DOCA_CTX_STATE_IDLE);
	size_t dl = 0;
	OK(doca_buf_get_data_len(dst, &dl));
	CHECK(dl == 32);

	/* Restart and stop with nothing out: synchronous. */
	OK(doca_ctx_start(ctx));
	OK(doca_ctx_stop(ctx));
	CHECK(log.n == 5 && log.next[4] == DOCA_CTX_STATE_IDLE);
	CHECK_RC(doca_pe_destroy(pe), DOCA_ERROR_IN_USE); /* ctx still connected */
	OK(doca_dma_destroy(dma));
	OK(doca_pe_destroy(pe));

	OK(doca_buf_set_data(dst, mem + 4096 + 10, 5));
	CHECK_RC(doca_buf_set_data(dst, mem + 8190, 5), DOCA_ERROR_INVALID_VALUE);
	void *p = NULL;
	OK(doca_buf_get_head(dst, &p));
	CHECK(p == mem + 4096);
	OK(doca_buf_get_data(dst, &p));
	CHECK(p == mem + 4096 + 10);
	OK(doca_buf_get_len(dst, &n));
	CHECK(n == 4096);
	OK(doca_buf_dec_refcount(src, NULL));
	OK(doca_buf_dec_refcount(dst, NULL));
	OK(doca_buf_inventory_stop(inv));
	OK(doca_buf_inventory_destroy(inv));
	OK(doca_mmap_stop(m));
	OK(doca_mmap_rm_dev(m, dev));
	OK(doca_mmap_destroy(m));
	OK(doca_dev_close(dev));
	free(mem);
}
