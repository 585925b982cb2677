/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */
/* Driver scenarios 2, 3, 5: export/import and DMA, DMA without room, export errors (see driver.h) */

#include "driver.h"

/* ---- scenario 2: export, import, DMA in and out ---- */

void scenario_export_import_dma(void)
{
	const size_t host_len = 1 << 20, n = 4096, off = 1000;
	struct doca_dev *dev = open_dev();
	CHECK(dev != NULL);
	if (dev == NULL)
		return;
	uint8_t *host = calloc(1, host_len);
	uint8_t *local = malloc(2 * n);
	fill(local, n, 42);
	memset(local + n, 0, n);

	/* Host side: PCI export. */
	struct doca_mmap *hm = local_mmap(dev, host, host_len,
					  DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_PCI_READ_WRITE);
	CHECK(hm != NULL);
	const void *desc = NULL;
	size_t desc_len = 0;
	OK(doca_mmap_export_pci(hm, dev, &desc, &desc_len));
	CHECK(desc != NULL && desc_len == 40 && memcmp(desc, "DOCAMDL1", 8) == 0);

	/* DPU side: import (started at once). */
	struct doca_mmap *im = NULL;
	union doca_data mud = { .u64 = 77 };
	OK(doca_mmap_create_from_export(&mud, desc, desc_len, dev, &im));
	void *ia = NULL;
	size_t il = 0;
	OK(doca_mmap_get_memrange(im, &ia, &il));
	CHECK(ia == host && il == host_len);
	CHECK_RC(doca_mmap_start(im), DOCA_ERROR_NOT_PERMITTED);
	CHECK_RC(doca_mmap_set_permissions(im, DOCA_ACCESS_FLAG_RDMA_WRITE), DOCA_ERROR_NOT_PERMITTED);
	/* Re-export: RDMA yes, PCI no. */
	const void *rdesc = NULL;
	size_t rlen = 0;
	OK(doca_mmap_export_rdma(im, dev, &rdesc, &rlen));
	CHECK(rlen == 40);
	CHECK_RC(doca_mmap_export_pci(im, dev, &rdesc, &rlen), DOCA_ERROR_NOT_PERMITTED);

	struct doca_mmap *lm = local_mmap(dev, local, 2 * n, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
	CHECK(lm != NULL);
	struct doca_buf_inventory *inv = NULL;
	OK(doca_buf_inventory_create(8, &inv));
	OK(doca_buf_inventory_start(inv));

	struct doca_buf *src = NULL, *dst = NULL, *back_src = NULL, *back_dst = NULL;
	/* by_data: the whole range is data; by_addr: empty data at the start. */
	OK(doca_buf_inventory_buf_get_by_args(inv, lm, local, n, local, n, &src));
	OK(doca_buf_inventory_buf_get_by_args(inv, im, host + off, n, host + off, 0, &dst));
	/* A range outside the mmap is refused. */
	struct doca_buf *bad = NULL;
	CHECK_RC(doca_buf_inventory_buf_get_by_args(inv, im, host + host_len - 10, 20, host + host_len - 10, 0, &bad),
		 DOCA_ERROR_INVALID_VALUE);
	CHECK_RC(doca_buf_inventory_buf_get_by_args(inv, lm, local, n, local + 10, n, &bad), DOCA_ERROR_INVALID_VALUE);

	struct dma_env e;
	CHECK(dma_env_up(&e, dev, 4));
	CHECK(e.log.n == 1 && e.log.prev[0] == DOCA_CTX_STATE_IDLE && e.log.next[0] == DOCA_CTX_STATE_RUNNING);
	struct completion c;

	/* In: local -> host at offset 1000. */
	OK(dma_copy(&e, src, dst, &c));
	CHECK(c.ok == 1 && c.err == 0 && c.status == DOCA_SUCCESS);
	size_t dl = 0;
	OK(doca_buf_get_data_len(dst, &dl));
	CHECK(dl == n);
	CHECK(memcmp(host + off, local, n) == 0);
	CHECK(host[off - 1] == 0 && host[off + n] == 0);

	/* Out: host at offset 1000 -> the local back buffer. */
	OK(doca_buf_inventory_buf_get_by_args(inv, im, host + off, n, host + off, n, &back_src));
	OK(doca_buf_inventory_buf_get_by_args(inv, lm, local + n, n, local + n, 0, &back_dst));
	OK(dma_copy(&e, back_src, back_dst, &c));
	CHECK(c.ok == 1 && c.status == DOCA_SUCCESS);
	CHECK(memcmp(local + n, local, n) == 0);

	/* Buffers pin the mmap. */
	CHECK_RC(doca_mmap_destroy(im), DOCA_ERROR_NOT_PERMITTED);
	CHECK_RC(doca_dev_close(dev), DOCA_ERROR_IN_USE);

	struct doca_buf *all[] = { src, dst, back_src, back_dst };
	for (unsigned i = 0; i < 4; i++) {
		uint16_t rc = 9;
		OK(doca_buf_dec_refcount(all[i], &rc));
		CHECK(rc == 0);
	}
	dma_env_down(&e);
	CHECK(e.log.n == 2 && e.log.next[1] == DOCA_CTX_STATE_IDLE);
	OK(doca_buf_inventory_stop(inv));
	OK(doca_buf_inventory_destroy(inv));
	OK(doca_mmap_destroy(im));
	OK(doca_mmap_destroy(lm));
	OK(doca_mmap_destroy(hm));
	OK(doca_dev_close(dev));
	free(host);
	free(local);
}

/* ---- scenario 3: DMA destination without room ---- */

void scenario_dma_no_room(void)
{
	struct doca_dev *dev = open_dev();
	CHECK(dev != NULL);
	if (dev == NULL)
		return;
	uint8_t *mem = calloc(1, 16384);
	fill(mem, 4096, 7);
	struct doca_mmap *m = local_mmap(dev, mem, 16384, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
	struct doca_buf_inventory *inv = NULL;
	OK(doca_buf_inventory_create(4, &inv));
	OK(doca_buf_inventory_start(inv));
	struct doca_buf *src = NULL, *small = NULL, *tight = NULL;
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem, 4096, mem, 4096, &src));
	/* 100 bytes of room for 4096 bytes. */
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 4096, 100, mem + 4096, 0, &small));
	/* 4146-byte buffer already holding 50 bytes: exactly 4096 bytes of room. */
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 8192, 4146, mem + 8192, 50, &tight));
	memset(mem + 8192, 0xee, 50);

	struct dma_env e;
	CHECK(dma_env_up(&e, dev, 2));
	struct completion c;
	CHECK_RC(dma_copy(&e, src, small, &c), DOCA_ERROR_INVALID_VALUE);
	CHECK(c.ok == 0 && c.err == 1 && c.status == DOCA_ERROR_INVALID_VALUE);
	size_t dl = 9;
	OK(doca_buf_get_data_len(small, &dl));
	CHECK(dl == 0);

	/* try_submit validates up front: not submitted, the caller keeps it. */
	struct doca_dma_task_memcpy *t = NULL;
	union doca_data ud = { .ptr = &c };
	OK(doca_dma_task_memcpy_alloc_init(e.dma, src, small, ud, &t));
	CHECK_RC(doca_task_try_submit(doca_dma_task_memcpy_as_task(t)), DOCA_ERROR_INVALID_VALUE);
	doca_task_free(doca_dma_task_memcpy_as_task(t));

	/* Output is appended after the existing data. */
	OK(dma_copy(&e, src, tight, &c));
	CHECK(c.ok == 1);
	OK(doca_buf_get_data_len(tight, &dl));
	CHECK(dl == 4146);
	CHECK(mem[8192] == 0xee && mem[8192 + 49] == 0xee && memcmp(mem + 8192 + 50, mem, 4096) == 0);
	/* Now full: the next copy fails. */
	CHECK_RC(dma_copy(&e, src, tight, &c), DOCA_ERROR_INVALID_VALUE);
	CHECK(c.err == 1);

	OK(doca_buf_dec_refcount(src, NULL));
	OK(doca_buf_dec_refcount(small, NULL));
	OK(doca_buf_dec_refcount(tight, NULL));
	dma_env_down(&e);
	OK(doca_buf_inventory_destroy(inv));
	OK(doca_mmap_destroy(m));
	OK(doca_dev_close(dev));
	free(mem);
}

/* ---- scenario 5: export permissions and corrupted descriptors ---- */

void scenario_export_errors(void)
{
	struct doca_dev *dev = open_dev();
	CHECK(dev != NULL);
	if (dev == NULL)
		return;
	uint8_t *mem = calloc(1, 65536);
	const void *desc = NULL;
	size_t len = 0;

	/* Not started yet: not permitted. */
	struct doca_mmap *m = NULL;
	OK(doca_mmap_create(&m));
	OK(doca_mmap_set_memrange(m, mem, 65536));
	CHECK_RC(doca_mmap_set_memrange(m, mem, 100), DOCA_ERROR_NOT_PERMITTED); /* only once */
	OK(doca_mmap_set_permissions(m, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE));
	CHECK_RC(doca_mmap_start(m), DOCA_ERROR_BAD_STATE); /* no device */
	OK(doca_mmap_add_dev(m, dev));
	CHECK_RC(doca_mmap_add_dev(m, dev), DOCA_ERROR_ALREADY_EXIST);
	CHECK_RC(doca_mmap_export_pci(m, dev, &desc, &len), DOCA_ERROR_NOT_PERMITTED);
	OK(doca_mmap_start(m));
	CHECK_RC(doca_mmap_set_memrange(m, mem, 100), DOCA_ERROR_BAD_STATE); /* started */
	CHECK_RC(doca_mmap_set_permissions(m, DOCA_ACCESS_FLAG_PCI_READ_WRITE), DOCA_ERROR_BAD_STATE);
	/* Started, but no PCI (or RDMA) permission. */
	CHECK_RC(doca_mmap_export_pci(m, dev, &desc, &len), DOCA_ERROR_NOT_PERMITTED);
	CHECK_RC(doca_mmap_export_rdma(m, dev, &desc, &len), DOCA_ERROR_NOT_PERMITTED);
	OK(doca_mmap_destroy(m));

	CHECK_RC(doca_mmap_set_dmabuf_memrange(NULL, 3, mem, 0, 4096), DOCA_ERROR_NOT_SUPPORTED);

	m = local_mmap(dev, mem, 65536,
		       DOCA_ACCESS_FLAG_PCI_READ_ONLY | DOCA_ACCESS_FLAG_RDMA_READ | DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
	CHECK(m != NULL);
	OK(doca_mmap_export_pci(m, dev, &desc, &len));
	unsigned char blob[40];
	CHECK(len == sizeof(blob));
	memcpy(blob, desc, sizeof(blob));
	struct doca_mmap *im = NULL;

	/* Corrupted magic, wrong length, another process, RDMA kind. */
	blob[3] ^= 0xff;
	CHECK_RC(doca_mmap_create_from_export(NULL, blob, sizeof(blob), dev, &im), DOCA_ERROR_INVALID_VALUE);
	blob[3] ^= 0xff;
	CHECK_RC(doca_mmap_create_from_export(NULL, blob, sizeof(blob) - 1, dev, &im), DOCA_ERROR_INVALID_VALUE);
	/* Another process's PCI descriptor: refused in same-process-only mode
	 * (scenario 8 imports one for real without it). */
	uint64_t other_pid = (uint64_t)getpid() + 1;
	memcpy(blob + 8, &other_pid, 8);
	setenv("SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY", "1", 1);
	CHECK_RC(doca_mmap_create_from_export(NULL, blob, sizeof(blob), dev, &im), DOCA_ERROR_NOT_PERMITTED);
	unsetenv("SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY");
	/* Not a pid at all. */
	uint64_t bad_pid = 0;
	memcpy(blob + 8, &bad_pid, 8);
	CHECK_RC(doca_mmap_create_from_export(NULL, blob, sizeof(blob), dev, &im), DOCA_ERROR_INVALID_VALUE);
	bad_pid = UINT64_C(1) << 40;
	memcpy(blob + 8, &bad_pid, 8);
	CHECK_RC(doca_mmap_create_from_export(NULL, blob, sizeof(blob), dev, &im), DOCA_ERROR_INVALID_VALUE);
	const void *rdesc = NULL;
	size_t rlen = 0;
	OK(doca_mmap_export_rdma(m, dev, &rdesc, &rlen));
	CHECK_RC(doca_mmap_create_from_export(NULL, rdesc, rlen, dev, &im), DOCA_ERROR_NOT_SUPPORTED);
	/* An RDMA descriptor from another process: no RDMA transport at all. */
	CHECK(rlen == sizeof(blob));
	memcpy(blob, rdesc, sizeof(blob));
	memcpy(blob + 8, &other_pid, 8);
	CHECK_RC(doca_mmap_create_from_export(NULL, blob, sizeof(blob), dev, &im), DOCA_ERROR_NOT_PERMITTED);

	/* The good one imports; read-only PCI means the importer cannot write. */
	OK(doca_mmap_create_from_export(NULL, desc, len, dev, &im));
	struct doca_buf_inventory *inv = NULL;
	OK(doca_buf_inventory_create(2, &inv));
	struct doca_buf *b1 = NULL, *b2 = NULL, *b3 = NULL;
	CHECK_RC(doca_buf_inventory_buf_get_by_args(inv, im, mem, 64, mem, 0, &b1), DOCA_ERROR_BAD_STATE);
	OK(doca_buf_inventory_start(inv));
	OK(doca_buf_inventory_buf_get_by_args(inv, im, mem, 64, mem, 0, &b1));
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 64, 64, mem + 64, 64, &b2));
	CHECK_RC(doca_buf_inventory_buf_get_by_args(inv, m, mem, 64, mem, 0, &b3), DOCA_ERROR_NO_MEMORY);
	struct dma_env e;
	CHECK(dma_env_up(&e, dev, 1));
	struct completion c;
	CHECK_RC(dma_copy(&e, b2, b1, &c), DOCA_ERROR_NOT_PERMITTED);
	CHECK(c.err == 1);
	dma_env_down(&e);
	CHECK_RC(doca_buf_inventory_destroy(inv), DOCA_ERROR_IN_USE);
	uint16_t rc = 0;
	OK(doca_buf_inc_refcount(b1, &rc));
	CHECK(rc == 2);
	OK(doca_buf_dec_refcount(b1, &rc));
	OK(doca_buf_dec_refcount(b1, &rc));
	CHECK(rc == 0);
	CHECK_RC(doca_buf_dec_refcount(b1, &rc), DOCA_ERROR_INVALID_VALUE); /* already returned */
	OK(doca_buf_dec_refcount(b2, NULL));
	OK(doca_buf_inventory_destroy(inv));
	OK(doca_mmap_destroy(im));
	OK(doca_mmap_destroy(m));
	OK(doca_dev_close(dev));
	free(mem);
}
