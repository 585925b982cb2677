/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */
/* Driver scenario 8: DMA across processes (see driver.h) */

#include "driver.h"

/* ---- scenario 8: import another process's PCI export, DMA across processes ---- */

/* The child's 1 MiB buffer holds fill(XP_SEED); the parent reads XP_N bytes at
 * XP_READ_OFF, writes fill(XP_WRITE_SEED) (XP_N bytes) at XP_WRITE_OFF and
 * copies XP_BOUNCE_N bytes from offset 0 to XP_BOUNCE_OFF inside the child. */
#define XP_LEN ((size_t)1 << 20)
#define XP_SEED 0x5eedu
#define XP_N ((size_t)64 << 10)
#define XP_READ_OFF 4096u
#define XP_WRITE_OFF 500000u
#define XP_WRITE_SEED 0xbeefu
#define XP_BOUNCE_OFF 800000u
#define XP_BOUNCE_N 4096u

static int read_full(int fd, void *p, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = read(fd, (uint8_t *)p + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		done += (size_t)r;
	}
	return 1;
}

static int write_full(int fd, const void *p, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = write(fd, (const uint8_t *)p + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		done += (size_t)r;
	}
	return 1;
}

/* What the child's buffer must hold once the parent is done. */
static void xp_expected(uint8_t *want)
{
	fill(want, XP_LEN, XP_SEED);
	fill(want + XP_WRITE_OFF, XP_N, XP_WRITE_SEED);
	memcpy(want + XP_BOUNCE_OFF, want, XP_BOUNCE_N);
}

/* The exporting child: 1 MiB with a pattern, mapped and exported for PCI; the
 * descriptor goes to desc_w; then it waits for a byte on go_r, checks what the
 * parent wrote and exits 0 (1: setup failed, 2: wrong bytes, 3: no go). */
static void xp_child(int desc_w, int go_r)
{
	alarm(60); /* never outlive a stuck parent */
	int status = 1;
	uint8_t *buf = malloc(XP_LEN), *want = malloc(XP_LEN);
	struct doca_dev *dev = open_dev();
	struct doca_mmap *m = NULL;
	const void *desc = NULL;
	size_t len = 0;
	if (buf == NULL || want == NULL || dev == NULL)
		goto out;
	fill(buf, XP_LEN, XP_SEED);
	m = local_mmap(dev, buf, XP_LEN, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_PCI_READ_WRITE);
	if (m == NULL || doca_mmap_export_pci(m, dev, &desc, &len) != DOCA_SUCCESS || len != 40 ||
	    !write_full(desc_w, desc, len))
		goto out;
	close(desc_w);
	desc_w = -1;
	char go;
	if (!read_full(go_r, &go, 1)) {
		status = 3;
		goto out;
	}
	xp_expected(want);
	status = 0;
	for (size_t i = 0; i < XP_LEN; i++) {
		if (buf[i] != want[i]) {
			fprintf(stderr, "    child: byte %zu is 0x%02x, expected 0x%02x\n", i, buf[i], want[i]);
			status = 2;
			break;
		}
	}
out:
	if (m != NULL && doca_mmap_destroy(m) != DOCA_SUCCESS && status == 0)
		status = 1;
	if (dev != NULL && doca_dev_close(dev) != DOCA_SUCCESS && status == 0)
		status = 1;
	free(buf);
	free(want);
	if (desc_w >= 0)
		close(desc_w);
	close(go_r);
	_exit(status); /* no atexit handlers, no stdio flush of the parent's buffers */
}

/* A buffer over [addr, addr+len) of mmap m with data_len bytes of data. */
static struct doca_buf *xp_buf(struct doca_buf_inventory *inv, struct doca_mmap *m, uint8_t *addr, size_t len,
			       size_t data_len)
{
	struct doca_buf *b = NULL;
	OK(doca_buf_inventory_buf_get_by_args(inv, m, addr, len, addr, data_len, &b));
	return b;
}

void scenario_cross_process(void)
{
	int dp[2] = { -1, -1 }, gp[2] = { -1, -1 };
	if (pipe(dp) != 0 || pipe(gp) != 0) {
		CHECK(!"pipe");
		return;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(dp[0]);
		close(gp[1]);
		xp_child(dp[1], gp[0]); /* does not return */
	}
	close(dp[1]);
	close(gp[0]);
	CHECK(pid > 0);
	if (pid < 0) {
		close(dp[0]);
		close(gp[1]);
		return;
	}

	struct doca_dev *dev = NULL;
	struct doca_mmap *im = NULL, *fm = NULL, *lm = NULL;
	struct doca_buf_inventory *inv = NULL;
	struct doca_buf *bufs[12] = { 0 };
	unsigned nb = 0;
	struct dma_env e;
	int env_up = 0, child_waited = 0;
	uint8_t *local = calloc(1, 2 * XP_N), *want = malloc(XP_LEN);
	unsigned char desc[40];
	int got = read_full(dp[0], desc, sizeof(desc));
	CHECK(got);
	dev = open_dev();
	CHECK(dev != NULL && local != NULL && want != NULL);
	if (!got || dev == NULL || local == NULL || want == NULL)
		goto out;
	uint64_t dpid, daddr, dlen;
	memcpy(&dpid, desc + 8, 8);
	memcpy(&daddr, desc + 16, 8);
	memcpy(&dlen, desc + 24, 8);
	CHECK(dpid == (uint64_t)pid && dlen == XP_LEN);
	/* An address in the child: never dereferenced here. */
	uint8_t *remote = (uint8_t *)(uintptr_t)daddr;

	/* Same-process-only mode refuses the child's descriptor. */
	setenv("SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY", "1", 1);
	CHECK_RC(doca_mmap_create_from_export(NULL, desc, sizeof(desc), dev, &im), DOCA_ERROR_NOT_PERMITTED);
	CHECK(im == NULL);
	unsetenv("SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY");
	union doca_data mud = { .u64 = 8 };
	OK(doca_mmap_create_from_export(&mud, desc, sizeof(desc), dev, &im));
	if (im == NULL)
		goto out;
	void *ia = NULL;
	size_t il = 0;
	OK(doca_mmap_get_memrange(im, &ia, &il));
	CHECK(ia == remote && il == XP_LEN);

	fill(local + XP_N, XP_N, XP_WRITE_SEED);
	lm = local_mmap(dev, local, 2 * XP_N, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
	CHECK(lm != NULL);
	OK(doca_buf_inventory_create(12, &inv));
	OK(doca_buf_inventory_start(inv));
	env_up = dma_env_up(&e, dev, 4);
	CHECK(env_up);
	if (lm == NULL || inv == NULL || !env_up)
		goto out;
	struct completion c;
	size_t dl = 0;

	/* Out of the child: 64 KiB at offset 4096 (process_vm_readv). */
	struct doca_buf *rsrc = bufs[nb++] = xp_buf(inv, im, remote + XP_READ_OFF, XP_N, XP_N);
	struct doca_buf *ldst = bufs[nb++] = xp_buf(inv, lm, local, XP_N, 0);
	OK(dma_copy(&e, rsrc, ldst, &c));
	CHECK(c.ok == 1 && c.err == 0 && c.status == DOCA_SUCCESS);
	OK(doca_buf_get_data_len(ldst, &dl));
	CHECK(dl == XP_N);
	fill(want, XP_LEN, XP_SEED);
	CHECK(memcmp(local, want + XP_READ_OFF, XP_N) == 0);

	/* Into the child: a new pattern at offset 500000 (process_vm_writev). */
	struct doca_buf *lsrc = bufs[nb++] = xp_buf(inv, lm, local + XP_N, XP_N, XP_N);
	struct doca_buf *rdst = bufs[nb++] = xp_buf(inv, im, remote + XP_WRITE_OFF, XP_N, 0);
	OK(dma_copy(&e, lsrc, rdst, &c));
	CHECK(c.ok == 1 && c.status == DOCA_SUCCESS);
	OK(doca_buf_get_data_len(rdst, &dl));
	CHECK(dl == XP_N);

	/* Child to child through the bounce buffer. */
	struct doca_buf *bsrc = bufs[nb++] = xp_buf(inv, im, remote, XP_BOUNCE_N, XP_BOUNCE_N);
	struct doca_buf *bdst = bufs[nb++] = xp_buf(inv, im, remote + XP_BOUNCE_OFF, XP_BOUNCE_N, 0);
	OK(dma_copy(&e, bsrc, bdst, &c));
	CHECK(c.ok == 1);

	/* A range the child does not map (a forged descriptor: page 1): EFAULT,
	 * the error callback with DOCA_ERROR_DRIVER, dst data length unchanged. */
	unsigned char forged[40];
	uint64_t faddr = 4096, flen = 8192;
	memcpy(forged, desc, sizeof(forged));
	memcpy(forged + 16, &faddr, 8);
	memcpy(forged + 24, &flen, 8);
	OK(doca_mmap_create_from_export(NULL, forged, sizeof(forged), dev, &fm));
	if (fm != NULL) {
		struct doca_buf *fdst = bufs[nb++] = xp_buf(inv, fm, (uint8_t *)(uintptr_t)faddr, 4096, 0);
		struct doca_buf *ssrc = bufs[nb++] = xp_buf(inv, lm, local + XP_N, 4096, 4096);
		CHECK_RC(dma_copy(&e, ssrc, fdst, &c), DOCA_ERROR_DRIVER);
		CHECK(c.ok == 0 && c.err == 1 && c.status == DOCA_ERROR_DRIVER);
		OK(doca_buf_get_data_len(fdst, &dl));
		CHECK(dl == 0);
	}

	/* AES-GCM refuses the child's memory: try_submit up front, submit via
	 * the error callback. */
	{
		struct doca_pe *pe = NULL;
		struct doca_aes_gcm *aes = NULL;
		struct doca_aes_gcm_key *k = NULL;
		struct doca_aes_gcm_task_encrypt *et = NULL;
		uint8_t key[32] = { 1 }, iv[12] = { 2 };
		union doca_data ud = { .ptr = &c };
		OK(doca_pe_create(&pe));
		OK(doca_aes_gcm_create(dev, &aes));
		OK(doca_aes_gcm_task_encrypt_set_conf(aes, enc_ok_cb, enc_err_cb, 1));
		OK(doca_pe_connect_ctx(pe, doca_aes_gcm_as_ctx(aes)));
		OK(doca_ctx_start(doca_aes_gcm_as_ctx(aes)));
		OK(doca_aes_gcm_key_create(aes, key, DOCA_AES_GCM_KEY_256, &k));
		struct doca_buf *edst = bufs[nb++] = xp_buf(inv, lm, local, XP_N, 0);
		memset(&c, 0, sizeof(c));
		OK(doca_aes_gcm_task_encrypt_alloc_init(aes, rsrc, edst, k, iv, 12, 16, 0, ud, &et));
		CHECK_RC(doca_task_try_submit(doca_aes_gcm_task_encrypt_as_task(et)), DOCA_ERROR_NOT_SUPPORTED);
		OK(doca_task_submit(doca_aes_gcm_task_encrypt_as_task(et)));
		CHECK(doca_pe_progress(pe) == 1 && c.ok == 0 && c.err == 1 && c.status == DOCA_ERROR_NOT_SUPPORTED);
		doca_task_free(doca_aes_gcm_task_encrypt_as_task(et));
		OK(doca_buf_get_data_len(edst, &dl));
		CHECK(dl == 0);
		OK(doca_ctx_stop(doca_aes_gcm_as_ctx(aes)));
		OK(doca_aes_gcm_key_destroy(k));
		OK(doca_aes_gcm_destroy(aes));
		OK(doca_pe_destroy(pe));
	}

	/* Let the child check its buffer and exit; wait for the exit without
	 * reaping it, so its pid cannot be reused while the stale import is
	 * tried (a zombie's memory is gone: ESRCH). */
	{
		char go = 'g';
		CHECK(write_full(gp[1], &go, 1));
		close(gp[1]);
		gp[1] = -1;
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		CHECK(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) == 0);
		CHECK(si.si_pid == pid && si.si_code == CLD_EXITED && si.si_status == 0);
		if (si.si_code != CLD_EXITED || si.si_status != 0)
			fprintf(stderr, "    child: si_code %d, status %d\n", si.si_code, si.si_status);
	}
	{
		struct doca_buf *sdst = bufs[nb++] = xp_buf(inv, im, remote + 600000, 4096, 0);
		struct doca_buf *ssrc2 = bufs[nb++] = xp_buf(inv, lm, local + XP_N, 4096, 4096);
		CHECK_RC(dma_copy(&e, ssrc2, sdst, &c), DOCA_ERROR_DRIVER);
		CHECK(c.ok == 0 && c.err == 1 && c.status == DOCA_ERROR_DRIVER);
		OK(doca_buf_get_data_len(sdst, &dl));
		CHECK(dl == 0);
		/* Reading from it fails the same way. */
		OK(doca_buf_set_data(ldst, local, 0));
		CHECK_RC(dma_copy(&e, rsrc, ldst, &c), DOCA_ERROR_DRIVER);
		CHECK(c.err == 1 && c.status == DOCA_ERROR_DRIVER);
	}

out:
	if (gp[1] >= 0)
		close(gp[1]); /* the child sees EOF and exits */
	close(dp[0]);
	{
		int status = 0;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		child_waited = 1;
	}
	for (unsigned i = 0; i < nb; i++)
		if (bufs[i] != NULL)
			OK(doca_buf_dec_refcount(bufs[i], NULL));
	if (env_up)
		dma_env_down(&e);
	if (inv != NULL) {
		OK(doca_buf_inventory_stop(inv));
		OK(doca_buf_inventory_destroy(inv));
	}
	if (fm != NULL)
		OK(doca_mmap_destroy(fm));
	if (im != NULL)
		OK(doca_mmap_destroy(im));
	if (lm != NULL)
		OK(doca_mmap_destroy(lm));
	if (dev != NULL)
		OK(doca_dev_close(dev));
	CHECK(child_waited);
	free(local);
	free(want);
}
