/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */

#include "model.h"

/* ========================================================================
 * libdoca_aes_gcm (OpenSSL EVP does the crypto)
 *
 * Buffer layout [brief, from public DOCA sample code]:
 *   encrypt: src data = AAD (aad_size) || plaintext
 *            appended to dst = AAD (copied, not encrypted) || ciphertext || tag
 *            (dst data_len grows by src_len + tag_size)
 *   decrypt: src data = AAD || ciphertext || tag
 *            appended to dst = AAD || plaintext (src_len - tag_size bytes)
 *
 * Authentication failure (tag mismatch on decrypt): the task fails through
 * its error callback with DOCA_ERROR_IO_FAILED. The public DOCA reference
 * consulted for this model does not say which code the hardware reports for
 * a tag mismatch, so IO_FAILED is the model's choice (DOCA 3.0 also has
 * DOCA_ERROR_AUTHENTICATION, which real DOCA might use instead). Nothing is
 * written to dst on failure.
 *
 * A source or destination in another process's memory (an mmap imported from
 * a foreign PCI export) is refused with DOCA_ERROR_NOT_SUPPORTED [brief].
 * ======================================================================== */

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#define MODEL_AES_TAG_MISMATCH DOCA_ERROR_IO_FAILED

enum { MODEL_AES_ENCRYPT = 0, MODEL_AES_DECRYPT = 1 };

struct doca_aes_gcm {
	uint32_t magic;
	struct doca_ctx *ctx;
	size_t nkeys;
};

struct doca_aes_gcm_key {
	uint32_t magic;
	struct doca_aes_gcm *owner;
	size_t len; /* 16 or 32 */
	unsigned char raw[32];
};

struct model_aes_payload {
	const struct doca_buf *src;
	struct doca_buf *dst;
	struct doca_aes_gcm_key *key;
	unsigned char iv[12];
	uint32_t iv_len;
	uint32_t tag_size;
	uint32_t aad_size;
};

static int model_aes_is_valid(const struct doca_aes_gcm *a)
{
	return a != NULL && a->magic == MAGIC_AES;
}

static int model_aes_key_is_valid(const struct doca_aes_gcm_key *k)
{
	return k != NULL && k->magic == MAGIC_AES_KEY;
}

/* GCM over (aad, in) into out. enc: writes tag_len bytes of tag; dec: checks
 * tag. Returns 1 on success, 0 on tag mismatch, -1 on a library failure. */
static int model_gcm(int enc, const struct doca_aes_gcm_key *key, const unsigned char *iv, int iv_len,
		     const unsigned char *aad, size_t aad_len, const unsigned char *in, size_t in_len,
		     unsigned char *out, unsigned char *tag, int tag_len)
{
	const size_t chunk = (size_t)1 << 30; /* EVP lengths are int */
	const EVP_CIPHER *cipher = key->len == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm();
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int rc = -1, n;
	if (x == NULL)
		return -1;
	if (EVP_CipherInit_ex(x, cipher, NULL, NULL, NULL, enc) != 1 ||
	    EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_IVLEN, iv_len, NULL) != 1 ||
	    EVP_CipherInit_ex(x, NULL, NULL, key->raw, iv, enc) != 1)
		goto out;
	for (size_t off = 0; off < aad_len; off += chunk) {
		size_t m = aad_len - off < chunk ? aad_len - off : chunk;
		if (EVP_CipherUpdate(x, NULL, &n, aad + off, (int)m) != 1)
			goto out;
	}
	size_t done = 0;
	for (size_t off = 0; off < in_len; off += chunk) {
		size_t m = in_len - off < chunk ? in_len - off : chunk;
		if (EVP_CipherUpdate(x, out + done, &n, in + off, (int)m) != 1)
			goto out;
		done += (size_t)n;
	}
	if (!enc && EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_TAG, tag_len, tag) != 1)
		goto out;
	if (EVP_CipherFinal_ex(x, out + done, &n) != 1) {
		rc = enc ? -1 : 0;
		goto out;
	}
	if (enc && EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_GET_TAG, tag_len, tag) != 1)
		goto out;
	rc = 1;
out:
	EVP_CIPHER_CTX_free(x);
	return rc;
}

static doca_error_t model_aes_can_start(void *impl)
{
	struct doca_aes_gcm *a = impl;
	/* At least one task type configured [brief]; code [model]. */
	return (model_ctx_task_configured(a->ctx, MODEL_AES_ENCRYPT) ||
		model_ctx_task_configured(a->ctx, MODEL_AES_DECRYPT)) ?
		       DOCA_SUCCESS :
		       DOCA_ERROR_INVALID_VALUE;
}

/* Checks a task against its buffers. On success: source bytes, output size
 * and the destination append point. */
static doca_error_t model_aes_prepare(struct doca_aes_gcm *a, unsigned type, const struct model_aes_payload *p,
				      uint8_t **src, size_t *src_len, size_t *out_len, uint8_t **dst)
{
	uint8_t *d;
	size_t dlen, room;
	if (!model_aes_key_is_valid(p->key) || p->key->owner != a)
		return DOCA_ERROR_INVALID_VALUE; /* key destroyed meanwhile */
	if (model_buf_view(p->src, src, src_len, NULL) != DOCA_SUCCESS ||
	    model_buf_view(p->dst, &d, &dlen, &room) != DOCA_SUCCESS)
		return DOCA_ERROR_INVALID_VALUE;
	/* Memory of another process (imported from its PCI export): the model
	 * encrypts only this process's memory; Sluice runs AES-GCM on local
	 * staging buffers only [brief]. Refused by try_submit, or through the
	 * error callback after submit. */
	if (model_buf_foreign_pid(p->src) != 0 || model_buf_foreign_pid(p->dst) != 0)
		return DOCA_ERROR_NOT_SUPPORTED;
	const struct doca_dev *dev = model_ctx_dev(a->ctx);
	doca_error_t rc = model_buf_check_access(p->src, dev, 0);
	if (rc == DOCA_SUCCESS)
		rc = model_buf_check_access(p->dst, dev, 1);
	if (rc != DOCA_SUCCESS)
		return rc;
	if (type == MODEL_AES_ENCRYPT) {
		if (*src_len < p->aad_size || *src_len > SIZE_MAX - p->tag_size)
			return DOCA_ERROR_INVALID_VALUE;
		*out_len = *src_len + p->tag_size;
	} else {
		if (*src_len < (size_t)p->aad_size + p->tag_size)
			return DOCA_ERROR_INVALID_VALUE;
		*out_len = *src_len - p->tag_size;
	}
	if (*out_len > room)
		return DOCA_ERROR_INVALID_VALUE; /* no room after dst's data [brief] */
	*dst = d + dlen;
	return DOCA_SUCCESS;
}

static doca_error_t model_aes_validate(void *impl, struct doca_task *task, unsigned type, void *payload)
{
	uint8_t *s, *d;
	size_t sl, ol;
	MODEL_UNUSED(task);
	return model_aes_prepare(impl, type, payload, &s, &sl, &ol, &d);
}

static doca_error_t model_aes_execute(void *impl, struct doca_task *task, unsigned type, void *payload)
{
	struct model_aes_payload *p = payload;
	uint8_t *s, *d;
	size_t sl, ol;
	MODEL_UNUSED(task);
	doca_error_t rc = model_aes_prepare(impl, type, p, &s, &sl, &ol, &d);
	if (rc != DOCA_SUCCESS)
		return rc;
	/* Work in a scratch buffer: src and dst may overlap, and a failed
	 * decrypt must not leave unauthenticated plaintext in dst. */
	unsigned char *tmp = malloc(ol > 0 ? ol : 1);
	if (tmp == NULL)
		return DOCA_ERROR_NO_MEMORY;
	size_t aad = p->aad_size;
	int r;
	memcpy(tmp, s, aad);
	if (type == MODEL_AES_ENCRYPT)
		r = model_gcm(1, p->key, p->iv, (int)p->iv_len, s, aad, s + aad, sl - aad, tmp + aad, tmp + sl,
			      (int)p->tag_size);
	else
		r = model_gcm(0, p->key, p->iv, (int)p->iv_len, s, aad, s + aad, sl - aad - p->tag_size, tmp + aad,
			      s + sl - p->tag_size, (int)p->tag_size);
	if (r == 1) {
		memcpy(d, tmp, ol);
		rc = model_buf_append(p->dst, ol);
	} else {
		rc = r == 0 ? MODEL_AES_TAG_MISMATCH : DOCA_ERROR_DRIVER;
	}
	OPENSSL_cleanse(tmp, ol > 0 ? ol : 1);
	free(tmp);
	return rc;
}

static const struct model_ctx_ops model_aes_ops = {
	.name = "aes_gcm",
	.can_start = model_aes_can_start,
	.validate = model_aes_validate,
	.execute = model_aes_execute,
};

MODEL_API doca_error_t doca_aes_gcm_create(struct doca_dev *dev, struct doca_aes_gcm **aes_gcm)
{
	if (!model_dev_is_valid(dev) || aes_gcm == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_aes_gcm *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return DOCA_ERROR_NO_MEMORY;
	doca_error_t rc = model_ctx_create(dev, &model_aes_ops, a, 2, &a->ctx);
	if (rc != DOCA_SUCCESS) {
		free(a);
		return rc;
	}
	a->magic = MAGIC_AES;
	*aes_gcm = a;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_aes_gcm_destroy(struct doca_aes_gcm *aes_gcm)
{
	enum doca_ctx_states st;
	if (!model_aes_is_valid(aes_gcm) || doca_ctx_get_state(aes_gcm->ctx, &st) != DOCA_SUCCESS)
		return DOCA_ERROR_INVALID_VALUE;
	if (st != DOCA_CTX_STATE_IDLE)
		return DOCA_ERROR_BAD_STATE; /* [doc] */
	if (aes_gcm->nkeys > 0)
		return DOCA_ERROR_IN_USE; /* [doc]: undestroyed keys */
	doca_error_t rc = model_ctx_destroy(aes_gcm->ctx);
	if (rc != DOCA_SUCCESS)
		return rc;
	aes_gcm->magic = 0;
	free(aes_gcm);
	return DOCA_SUCCESS;
}

MODEL_API struct doca_ctx *doca_aes_gcm_as_ctx(struct doca_aes_gcm *aes_gcm)
{
	return model_aes_is_valid(aes_gcm) ? aes_gcm->ctx : NULL;
}

MODEL_API doca_error_t doca_aes_gcm_cap_task_encrypt_is_supported(const struct doca_devinfo *devinfo)
{
	return model_devinfo_is_valid(devinfo) ? DOCA_SUCCESS : DOCA_ERROR_INVALID_VALUE;
}

MODEL_API doca_error_t doca_aes_gcm_cap_task_decrypt_is_supported(const struct doca_devinfo *devinfo)
{
	return model_devinfo_is_valid(devinfo) ? DOCA_SUCCESS : DOCA_ERROR_INVALID_VALUE;
}

MODEL_API doca_error_t doca_aes_gcm_key_create(struct doca_aes_gcm *aes_gcm, const void *raw_key,
					       enum doca_aes_gcm_key_type raw_key_type,
					       struct doca_aes_gcm_key **key)
{
	size_t len;
	if (!model_aes_is_valid(aes_gcm) || raw_key == NULL || key == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	switch (raw_key_type) {
	case DOCA_AES_GCM_KEY_128:
		len = 16;
		break;
	case DOCA_AES_GCM_KEY_256:
		len = 32;
		break;
	default:
		return DOCA_ERROR_INVALID_VALUE;
	}
	struct doca_aes_gcm_key *k = calloc(1, sizeof(*k));
	if (k == NULL)
		return DOCA_ERROR_NO_MEMORY;
	k->magic = MAGIC_AES_KEY;
	k->owner = aes_gcm;
	k->len = len;
	memcpy(k->raw, raw_key, len); /* the key is copied [brief] */
	aes_gcm->nkeys++;
	*key = k;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_aes_gcm_key_destroy(struct doca_aes_gcm_key *key)
{
	if (!model_aes_key_is_valid(key))
		return DOCA_ERROR_INVALID_VALUE;
	key->owner->nkeys--;
	OPENSSL_cleanse(key, sizeof(*key));
	free(key);
	return DOCA_SUCCESS;
}

static doca_error_t model_aes_set_conf(struct doca_aes_gcm *a, unsigned type, model_task_cb ok, model_task_cb err,
				       uint32_t num)
{
	if (!model_aes_is_valid(a))
		return DOCA_ERROR_INVALID_VALUE;
	return model_ctx_set_task_conf(a->ctx, type, ok, err, num);
}

MODEL_API doca_error_t doca_aes_gcm_task_encrypt_set_conf(struct doca_aes_gcm *aes_gcm,
							  doca_aes_gcm_task_encrypt_completion_cb_t task_completion_cb,
							  doca_aes_gcm_task_encrypt_completion_cb_t task_error_cb,
							  uint32_t num_tasks)
{
	return model_aes_set_conf(aes_gcm, MODEL_AES_ENCRYPT, (model_task_cb)task_completion_cb,
				  (model_task_cb)task_error_cb, num_tasks);
}

MODEL_API doca_error_t doca_aes_gcm_task_decrypt_set_conf(struct doca_aes_gcm *aes_gcm,
							  doca_aes_gcm_task_decrypt_completion_cb_t task_completion_cb,
							  doca_aes_gcm_task_decrypt_completion_cb_t task_error_cb,
							  uint32_t num_tasks)
{
	return model_aes_set_conf(aes_gcm, MODEL_AES_DECRYPT, (model_task_cb)task_completion_cb,
				  (model_task_cb)task_error_cb, num_tasks);
}

static doca_error_t model_aes_alloc(struct doca_aes_gcm *a, unsigned type, const struct doca_buf *src,
				    struct doca_buf *dst, struct doca_aes_gcm_key *key, const uint8_t *iv,
				    uint32_t iv_length, uint32_t tag_size, uint32_t aad_size,
				    union doca_data user_data, struct doca_task **task)
{
	if (!model_aes_is_valid(a) || src == NULL || dst == NULL || iv == NULL || task == NULL ||
	    !model_aes_key_is_valid(key) || key->owner != a)
		return DOCA_ERROR_INVALID_VALUE;
	/* IV 1..12 bytes [brief] (the reference says 0..12; OpenSSL's GCM
	 * needs at least one byte). Tag 12 or 16 bytes [doc]. IVs shorter than
	 * 12 bytes follow standard GCM (GHASH of the IV); whether BlueField
	 * hardware does the same is not verified -- use 12-byte IVs. */
	if (iv_length < 1 || iv_length > 12 || (tag_size != 12 && tag_size != 16))
		return DOCA_ERROR_INVALID_VALUE;
	void *payload;
	doca_error_t rc = model_task_alloc(a->ctx, type, sizeof(struct model_aes_payload), user_data, task, &payload);
	if (rc != DOCA_SUCCESS)
		return rc; /* BAD_STATE unless running, NO_MEMORY past num_tasks [doc] */
	struct model_aes_payload *p = payload;
	p->src = src;
	p->dst = dst;
	p->key = key;
	memcpy(p->iv, iv, iv_length);
	p->iv_len = iv_length;
	p->tag_size = tag_size;
	p->aad_size = aad_size;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_aes_gcm_task_encrypt_alloc_init(struct doca_aes_gcm *aes_gcm,
							    const struct doca_buf *src_buff, struct doca_buf *dst_buff,
							    struct doca_aes_gcm_key *key, const uint8_t *iv,
							    uint32_t iv_length, uint32_t tag_size, uint32_t aad_size,
							    union doca_data user_data,
							    struct doca_aes_gcm_task_encrypt **task)
{
	struct doca_task *t;
	if (task == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	doca_error_t rc = model_aes_alloc(aes_gcm, MODEL_AES_ENCRYPT, src_buff, dst_buff, key, iv, iv_length,
					  tag_size, aad_size, user_data, &t);
	if (rc == DOCA_SUCCESS)
		*task = (struct doca_aes_gcm_task_encrypt *)t;
	return rc;
}

MODEL_API doca_error_t doca_aes_gcm_task_decrypt_alloc_init(struct doca_aes_gcm *aes_gcm,
							    const struct doca_buf *src_buff, struct doca_buf *dst_buff,
							    struct doca_aes_gcm_key *key, const uint8_t *iv,
							    uint32_t iv_length, uint32_t tag_size, uint32_t aad_size,
							    union doca_data user_data,
							    struct doca_aes_gcm_task_decrypt **task)
{
	struct doca_task *t;
	if (task == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	doca_error_t rc = model_aes_alloc(aes_gcm, MODEL_AES_DECRYPT, src_buff, dst_buff, key, iv, iv_length,
					  tag_size, aad_size, user_data, &t);
	if (rc == DOCA_SUCCESS)
		*task = (struct doca_aes_gcm_task_decrypt *)t;
	return rc;
}

MODEL_API struct doca_task *doca_aes_gcm_task_encrypt_as_task(struct doca_aes_gcm_task_encrypt *task)
{
	return (struct doca_task *)task;
}

MODEL_API struct doca_task *doca_aes_gcm_task_decrypt_as_task(struct doca_aes_gcm_task_decrypt *task)
{
	return (struct doca_task *)task;
}
