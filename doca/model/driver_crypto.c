/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */
/* Driver scenario 4: AES-256-GCM against OpenSSL (see driver.h) */

#include "driver.h"

/* ---- scenario 4: AES-256-GCM ---- */

static int openssl_gcm_encrypt(const uint8_t *key, int key_len, const uint8_t *iv, int iv_len, const uint8_t *aad,
			       int aad_len, const uint8_t *pt, int pt_len, uint8_t *ct, uint8_t *tag, int tag_len)
{
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int n, ok = x != NULL &&
		    EVP_EncryptInit_ex(x, key_len == 32 ? EVP_aes_256_gcm() : EVP_aes_128_gcm(), NULL, NULL, NULL) &&
		    EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_IVLEN, iv_len, NULL) &&
		    EVP_EncryptInit_ex(x, NULL, NULL, key, iv) && EVP_EncryptUpdate(x, NULL, &n, aad, aad_len) &&
		    EVP_EncryptUpdate(x, ct, &n, pt, pt_len) && EVP_EncryptFinal_ex(x, ct + n, &n) &&
		    EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_GET_TAG, tag_len, tag);
	EVP_CIPHER_CTX_free(x);
	return ok;
}

void scenario_aes_gcm(void)
{
	enum { AAD = 36, PT = 1000, TAG = 16, IV = 12 };
	struct doca_dev *dev = open_dev();
	CHECK(dev != NULL);
	if (dev == NULL)
		return;
	uint8_t key[32], iv[IV];
	fill(key, sizeof(key), 1);
	fill(iv, sizeof(iv), 2);
	/* mem: [0,4096) src = AAD||PT, [4096,8192) encrypted, [8192,12288)
	 * decrypted, [12288,16384) tampered copy, [16384, 20480) scratch */
	uint8_t *mem = calloc(1, 20480);
	fill(mem, AAD + PT, 3);
	struct doca_mmap *m = local_mmap(dev, mem, 20480, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
	struct doca_buf_inventory *inv = NULL;
	OK(doca_buf_inventory_create(8, &inv));
	OK(doca_buf_inventory_start(inv));

	struct doca_pe *pe = NULL;
	struct doca_aes_gcm *aes = NULL;
	OK(doca_pe_create(&pe));
	OK(doca_aes_gcm_create(dev, &aes));
	struct doca_ctx *ctx = doca_aes_gcm_as_ctx(aes);
	OK(doca_aes_gcm_task_encrypt_set_conf(aes, enc_ok_cb, enc_err_cb, 2));
	OK(doca_aes_gcm_task_decrypt_set_conf(aes, dec_ok_cb, dec_err_cb, 2));
	OK(doca_pe_connect_ctx(pe, ctx));
	struct doca_aes_gcm_key *k = NULL;
	CHECK_RC(doca_aes_gcm_key_create(aes, key, (enum doca_aes_gcm_key_type)3, &k), DOCA_ERROR_INVALID_VALUE);
	OK(doca_aes_gcm_key_create(aes, key, DOCA_AES_GCM_KEY_256, &k));

	struct doca_buf *src = NULL, *enc = NULL, *dec = NULL, *tam = NULL, *tam_out = NULL;
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem, 4096, mem, AAD + PT, &src));
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 4096, 4096, mem + 4096, 0, &enc));
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 8192, 4096, mem + 8192, 0, &dec));

	struct completion c;
	union doca_data ud = { .ptr = &c };
	struct doca_aes_gcm_task_encrypt *et = NULL;
	struct doca_aes_gcm_task_decrypt *dt = NULL;
	/* Not running yet. */
	CHECK_RC(doca_aes_gcm_task_encrypt_alloc_init(aes, src, enc, k, iv, IV, TAG, AAD, ud, &et),
		 DOCA_ERROR_BAD_STATE);
	OK(doca_ctx_start(ctx));
	/* Bad tag / IV sizes. */
	CHECK_RC(doca_aes_gcm_task_encrypt_alloc_init(aes, src, enc, k, iv, IV, 13, AAD, ud, &et),
		 DOCA_ERROR_INVALID_VALUE);
	CHECK_RC(doca_aes_gcm_task_encrypt_alloc_init(aes, src, enc, k, iv, 13, TAG, AAD, ud, &et),
		 DOCA_ERROR_INVALID_VALUE);
	CHECK_RC(doca_aes_gcm_task_encrypt_alloc_init(aes, src, enc, k, iv, 0, TAG, AAD, ud, &et),
		 DOCA_ERROR_INVALID_VALUE);

	/* Encrypt. */
	memset(&c, 0, sizeof(c));
	OK(doca_aes_gcm_task_encrypt_alloc_init(aes, src, enc, k, iv, IV, TAG, AAD, ud, &et));
	OK(doca_task_submit(doca_aes_gcm_task_encrypt_as_task(et)));
	CHECK(doca_pe_progress(pe) == 1 && c.ok == 1 && c.err == 0);
	doca_task_free(doca_aes_gcm_task_encrypt_as_task(et));
	size_t dl = 0;
	OK(doca_buf_get_data_len(enc, &dl));
	CHECK(dl == AAD + PT + TAG);
	/* Same bytes as OpenSSL directly: AAD || ciphertext || tag. */
	uint8_t want[AAD + PT + TAG];
	memcpy(want, mem, AAD);
	CHECK(openssl_gcm_encrypt(key, 32, iv, IV, mem, AAD, mem + AAD, PT, want + AAD, want + AAD + PT, TAG));
	CHECK(memcmp(mem + 4096, want, sizeof(want)) == 0);

	/* Decrypt round trip: AAD || plaintext. */
	memset(&c, 0, sizeof(c));
	OK(doca_aes_gcm_task_decrypt_alloc_init(aes, enc, dec, k, iv, IV, TAG, AAD, ud, &dt));
	OK(doca_task_submit(doca_aes_gcm_task_decrypt_as_task(dt)));
	CHECK(doca_pe_progress(pe) == 1 && c.ok == 1);
	doca_task_free(doca_aes_gcm_task_decrypt_as_task(dt));
	OK(doca_buf_get_data_len(dec, &dl));
	CHECK(dl == AAD + PT);
	CHECK(memcmp(mem + 8192, mem, AAD + PT) == 0);

	/* Tampered tag: error callback, DOCA_ERROR_IO_FAILED, nothing written. */
	memcpy(mem + 12288, mem + 4096, AAD + PT + TAG);
	mem[12288 + AAD + PT + 3] ^= 0x01;
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 12288, 4096, mem + 12288, AAD + PT + TAG, &tam));
	OK(doca_buf_inventory_buf_get_by_args(inv, m, mem + 16384, 4096, mem + 16384, 0, &tam_out));
	memset(&c, 0, sizeof(c));
	OK(doca_aes_gcm_task_decrypt_alloc_init(aes, tam, tam_out, k, iv, IV, TAG, AAD, ud, &dt));
	OK(doca_task_submit(doca_aes_gcm_task_decrypt_as_task(dt)));
	CHECK(doca_pe_progress(pe) == 1 && c.ok == 0 && c.err == 1);
	CHECK(c.status == DOCA_ERROR_IO_FAILED);
	doca_task_free(doca_aes_gcm_task_decrypt_as_task(dt));
	OK(doca_buf_get_data_len(tam_out, &dl));
	CHECK(dl == 0);
	/* Tampered AAD fails too. */
	memcpy(mem + 12288, mem + 4096, AAD + PT + TAG);
	mem[12288 + 5] ^= 0x80;
	memset(&c, 0, sizeof(c));
	OK(doca_aes_gcm_task_decrypt_alloc_init(aes, tam, tam_out, k, iv, IV, TAG, AAD, ud, &dt));
	OK(doca_task_submit(doca_aes_gcm_task_decrypt_as_task(dt)));
	CHECK(doca_pe_progress(pe) == 1 && c.err == 1 && c.status == DOCA_ERROR_IO_FAILED);
	doca_task_free(doca_aes_gcm_task_decrypt_as_task(dt));

	/* AES-128 with a 12-byte tag matches OpenSSL too. */
	struct doca_aes_gcm_key *k128 = NULL;
	OK(doca_aes_gcm_key_create(aes, key, DOCA_AES_GCM_KEY_128, &k128));
	OK(doca_buf_set_data(tam_out, mem + 16384, 0));
	memset(&c, 0, sizeof(c));
	OK(doca_aes_gcm_task_encrypt_alloc_init(aes, src, tam_out, k128, iv, IV, 12, AAD, ud, &et));
	OK(doca_task_submit(doca_aes_gcm_task_encrypt_as_task(et)));
	CHECK(doca_pe_progress(pe) == 1 && c.ok == 1);
	doca_task_free(doca_aes_gcm_task_encrypt_as_task(et));
	CHECK(openssl_gcm_encrypt(key, 16, iv, IV, mem, AAD, mem + AAD, PT, want + AAD, want + AAD + PT, 12));
	OK(doca_buf_get_data_len(tam_out, &dl));
	CHECK(dl == AAD + PT + 12 && memcmp(mem + 16384, want, AAD + PT + 12) == 0);

	/* Keys block destroy; a running context blocks destroy. */
	CHECK_RC(doca_aes_gcm_destroy(aes), DOCA_ERROR_BAD_STATE);
	OK(doca_ctx_stop(ctx));
	CHECK_RC(doca_aes_gcm_destroy(aes), DOCA_ERROR_IN_USE);
	OK(doca_aes_gcm_key_destroy(k));
	OK(doca_aes_gcm_key_destroy(k128));
	OK(doca_aes_gcm_destroy(aes));
	OK(doca_pe_destroy(pe));
	struct doca_buf *all[] = { src, enc, dec, tam, tam_out };
	for (unsigned i = 0; i < 5; i++)
		OK(doca_buf_dec_refcount(all[i], NULL));
	OK(doca_buf_inventory_destroy(inv));
	OK(doca_mmap_destroy(m));
	OK(doca_dev_close(dev));
	free(mem);
}
