/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */

#include "common.h"

#include <limits.h>
#include <sys/types.h>
#include <unistd.h>

/* ========================================================================
 * libdoca_common: memory maps, PCI/RDMA export and import, buffers,
 * inventories (the rest of libdoca_common: common_dev.c, common_core.c)
 * ======================================================================== */

/* ---- memory maps ---- */

#define MODEL_MMAP_MAX_DEVS 64u

struct model_export {
	struct model_export *next;
	unsigned char blob[MODEL_EXPORT_LEN];
};

struct doca_mmap {
	uint32_t magic;
	int started;
	int imported; /* created from an export */
	pid_t owner_pid; /* imported: the exporting process (may be this one) */
	int memrange_set;
	uintptr_t addr;
	size_t len;
	uint32_t perms;
	uint32_t max_devs;
	uint32_t ndevs;
	struct doca_dev *devs[MODEL_MMAP_MAX_DEVS];
	size_t nbufs; /* doca_bufs over this mmap not yet returned */
	struct model_export *exports;
	union doca_data user_data;
};

#define MODEL_ACCESS_ALL 0x7fu

static int model_mmap_is_valid(const struct doca_mmap *m)
{
	return m != NULL && m->magic == MAGIC_MMAP;
}

static void model_mmap_free_exports(struct doca_mmap *m)
{
	while (m->exports != NULL) {
		struct model_export *e = m->exports;
		m->exports = e->next;
		memset(e->blob, 0, sizeof(e->blob));
		free(e);
	}
}

MODEL_API doca_error_t doca_mmap_create(struct doca_mmap **mmap)
{
	if (mmap == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_mmap *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return DOCA_ERROR_NO_MEMORY;
	m->magic = MAGIC_MMAP;
	m->perms = DOCA_ACCESS_FLAG_LOCAL_READ_WRITE; /* default [model] */
	m->max_devs = MODEL_MMAP_MAX_DEVS;
	*mmap = m;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_destroy(struct doca_mmap *mmap)
{
	if (!model_mmap_is_valid(mmap))
		return DOCA_ERROR_INVALID_VALUE;
	/* Buffers still point into it [doc]. */
	if (mmap->nbufs > 0)
		return DOCA_ERROR_NOT_PERMITTED;
	for (uint32_t i = 0; i < mmap->ndevs; i++)
		mmap->devs[i]->users--;
	/* Destroy implicitly stops [doc]; export descriptors die with the mmap [brief]. */
	model_mmap_free_exports(mmap);
	mmap->magic = 0;
	free(mmap);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_start(struct doca_mmap *mmap)
{
	if (!model_mmap_is_valid(mmap))
		return DOCA_ERROR_INVALID_VALUE;
	if (mmap->imported)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	if (mmap->started)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	if (!mmap->memrange_set || mmap->ndevs == 0)
		return DOCA_ERROR_BAD_STATE; /* [brief] */
	mmap->started = 1;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_stop(struct doca_mmap *mmap)
{
	if (!model_mmap_is_valid(mmap))
		return DOCA_ERROR_INVALID_VALUE;
	if (mmap->imported)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc]: created from export; destroy it instead */
	if (!mmap->started)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	if (mmap->nbufs > 0)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	/* Stop frees the export descriptors [doc]. (The model does not track the
	 * mmaps imported from them, in this process or another; real DOCA
	 * invalidates those. An importer in another process keeps reaching the
	 * memory until it is unmapped or this process exits.) */
	model_mmap_free_exports(mmap);
	mmap->started = 0;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_add_dev(struct doca_mmap *mmap, struct doca_dev *dev)
{
	if (!model_mmap_is_valid(mmap) || !model_dev_is_valid(dev))
		return DOCA_ERROR_INVALID_VALUE;
	if (mmap->imported || mmap->started)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	for (uint32_t i = 0; i < mmap->ndevs; i++)
		if (mmap->devs[i] == dev)
			return DOCA_ERROR_ALREADY_EXIST; /* [doc] */
	if (mmap->ndevs >= mmap->max_devs)
		return DOCA_ERROR_NO_MEMORY; /* [doc] */
	mmap->devs[mmap->ndevs++] = dev;
	dev->users++;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_rm_dev(struct doca_mmap *mmap, struct doca_dev *dev)
{
	if (!model_mmap_is_valid(mmap) || !model_dev_is_valid(dev))
		return DOCA_ERROR_INVALID_VALUE;
	if (mmap->imported || mmap->started)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	for (uint32_t i = 0; i < mmap->ndevs; i++) {
		if (mmap->devs[i] == dev) {
			mmap->devs[i] = mmap->devs[--mmap->ndevs];
			mmap->devs[mmap->ndevs] = NULL;
			dev->users--;
			return DOCA_SUCCESS;
		}
	}
	return DOCA_ERROR_NOT_FOUND; /* [doc] */
}

MODEL_API doca_error_t doca_mmap_set_memrange(struct doca_mmap *mmap, void *addr, size_t len)
{
	if (!model_mmap_is_valid(mmap) || addr == NULL || len == 0 || (uintptr_t)addr > UINTPTR_MAX - len)
		return DOCA_ERROR_INVALID_VALUE; /* [doc] incl. overflow */
	if (mmap->imported)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	if (mmap->started)
		return DOCA_ERROR_BAD_STATE; /* [doc] */
	if (mmap->memrange_set)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc]: only once */
	mmap->addr = (uintptr_t)addr;
	mmap->len = len;
	mmap->memrange_set = 1;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_set_dmabuf_memrange(struct doca_mmap *mmap, int dmabuf_fd, void *addr,
						     size_t dmabuf_offset, size_t len)
{
	MODEL_UNUSED(mmap);
	MODEL_UNUSED(dmabuf_fd);
	MODEL_UNUSED(addr);
	MODEL_UNUSED(dmabuf_offset);
	MODEL_UNUSED(len);
	return DOCA_ERROR_NOT_SUPPORTED; /* no GPU in the model [brief] */
}

MODEL_API doca_error_t doca_mmap_get_memrange(const struct doca_mmap *mmap, void **addr, size_t *len)
{
	if (!model_mmap_is_valid(mmap) || addr == NULL || len == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	if (!mmap->memrange_set)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	*addr = (void *)mmap->addr;
	*len = mmap->len;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_set_permissions(struct doca_mmap *mmap, uint32_t access_mask)
{
	if (!model_mmap_is_valid(mmap) || (access_mask & ~MODEL_ACCESS_ALL) != 0)
		return DOCA_ERROR_INVALID_VALUE;
	if (mmap->imported)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	if (mmap->started)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	mmap->perms = access_mask;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_set_max_num_devices(struct doca_mmap *mmap, uint32_t max_num_devices)
{
	if (!model_mmap_is_valid(mmap) || max_num_devices == 0 || max_num_devices > MODEL_MMAP_MAX_DEVS ||
	    max_num_devices < mmap->ndevs)
		return DOCA_ERROR_INVALID_VALUE; /* [model] */
	if (mmap->imported)
		return DOCA_ERROR_NOT_PERMITTED;
	if (mmap->started)
		return DOCA_ERROR_BAD_STATE;
	mmap->max_devs = max_num_devices;
	return DOCA_SUCCESS;
}

static void model_put_u64(unsigned char *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
}

static void model_put_u32(unsigned char *p, uint32_t v)
{
	memcpy(p, &v, sizeof(v));
}

static uint64_t model_get_u64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static uint32_t model_get_u32(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static doca_error_t model_mmap_export(struct doca_mmap *mmap, const struct doca_dev *dev, const void **export_desc,
				      size_t *export_desc_len, uint32_t kind)
{
	if (!model_mmap_is_valid(mmap) || !model_dev_is_valid(dev) || export_desc == NULL ||
	    export_desc_len == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	if (!mmap->started)
		return DOCA_ERROR_NOT_PERMITTED; /* [doc]: un-started mmap */
	if (kind == MODEL_EXPORT_KIND_PCI) {
		/* An imported mmap cannot be exported to PCI again [brief]. */
		if (mmap->imported)
			return DOCA_ERROR_NOT_PERMITTED;
		if ((mmap->perms & (DOCA_ACCESS_FLAG_PCI_READ_ONLY | DOCA_ACCESS_FLAG_PCI_READ_WRITE)) == 0)
			return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	} else {
		/* The RDMA re-export of host memory imported over PCI is allowed
		 * [brief] (older references forbid exporting imported mmaps at all;
		 * Sluice's direct path relies on newer DOCA allowing it). An
		 * imported mmap's permissions are the host's and cannot be set on
		 * the DPU, so only local mmaps are checked for RDMA access. */
		if (!mmap->imported &&
		    (mmap->perms & (DOCA_ACCESS_FLAG_RDMA_READ | DOCA_ACCESS_FLAG_RDMA_WRITE)) == 0)
			return DOCA_ERROR_NOT_PERMITTED; /* [doc] */
	}
	int found = 0;
	for (uint32_t i = 0; i < mmap->ndevs; i++)
		found |= mmap->devs[i] == dev;
	if (!found)
		return DOCA_ERROR_NOT_FOUND; /* [doc]: device not added to the mmap */
	struct model_export *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return DOCA_ERROR_NO_MEMORY;
	memcpy(e->blob, MODEL_EXPORT_MAGIC, 8);
	/* The owner of the memory: for the RDMA re-export of an imported mmap,
	 * the process that exported it over PCI (which may be another one). */
	model_put_u64(e->blob + 8, (uint64_t)(mmap->imported ? mmap->owner_pid : getpid()));
	model_put_u64(e->blob + 16, (uint64_t)mmap->addr);
	model_put_u64(e->blob + 24, (uint64_t)mmap->len);
	model_put_u32(e->blob + 32, mmap->perms);
	model_put_u32(e->blob + 36, kind);
	e->next = mmap->exports;
	mmap->exports = e;
	*export_desc = e->blob;
	*export_desc_len = MODEL_EXPORT_LEN;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_export_pci(struct doca_mmap *mmap, const struct doca_dev *dev,
					    const void **export_desc, size_t *export_desc_len)
{
	return model_mmap_export(mmap, dev, export_desc, export_desc_len, MODEL_EXPORT_KIND_PCI);
}

MODEL_API doca_error_t doca_mmap_export_rdma(struct doca_mmap *mmap, const struct doca_dev *dev,
					     const void **export_desc, size_t *export_desc_len)
{
	return model_mmap_export(mmap, dev, export_desc, export_desc_len, MODEL_EXPORT_KIND_RDMA);
}

/* SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY=1 (any value but "" and "0"): imports
 * of another process's export are refused [brief]. */
static int model_same_process_only(void)
{
	const char *v = getenv("SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY");
	return v != NULL && v[0] != 0 && strcmp(v, "0") != 0;
}

MODEL_API doca_error_t doca_mmap_create_from_export(const union doca_data *user_data, const void *export_desc,
						    size_t export_desc_len, struct doca_dev *dev,
						    struct doca_mmap **mmap)
{
	if (export_desc == NULL || mmap == NULL || !model_dev_is_valid(dev))
		return DOCA_ERROR_INVALID_VALUE;
	const unsigned char *b = export_desc;
	/* Not a model descriptor [brief]. */
	if (export_desc_len != MODEL_EXPORT_LEN || memcmp(b, MODEL_EXPORT_MAGIC, 8) != 0)
		return DOCA_ERROR_INVALID_VALUE;
	uint64_t pid = model_get_u64(b + 8);
	uint64_t addr = model_get_u64(b + 16);
	uint64_t len = model_get_u64(b + 24);
	uint32_t perms = model_get_u32(b + 32);
	uint32_t kind = model_get_u32(b + 36);
	if ((kind != MODEL_EXPORT_KIND_PCI && kind != MODEL_EXPORT_KIND_RDMA) || len == 0 ||
	    addr > UINTPTR_MAX || len > SIZE_MAX || addr > UINTPTR_MAX - len || (perms & ~MODEL_ACCESS_ALL) != 0 ||
	    pid == 0 || pid > (uint64_t)INT_MAX)
		return DOCA_ERROR_INVALID_VALUE; /* pid: not a Linux pid [model] */
	/* A PCI descriptor from another process of the same user is accepted;
	 * DMA then reaches that process's memory with process_vm_readv/writev
	 * [brief]. Whether the exporter is still alive is not checked here: like
	 * a host going away, that shows at DMA time. Refused with NOT_PERMITTED
	 * [brief] for an RDMA descriptor (the model has no RDMA transport) and,
	 * when SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY is set (and not "0"), for
	 * every foreign descriptor (the model's earlier same-process rule). */
	if (pid != (uint64_t)getpid() && (kind != MODEL_EXPORT_KIND_PCI || model_same_process_only()))
		return DOCA_ERROR_NOT_PERMITTED;
	/* Only PCI descriptors can be imported: the model has no RDMA [brief]. */
	if (kind != MODEL_EXPORT_KIND_PCI)
		return DOCA_ERROR_NOT_SUPPORTED;
	struct doca_mmap *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return DOCA_ERROR_NO_MEMORY;
	m->magic = MAGIC_MMAP;
	m->started = 1; /* usable at once [brief] */
	m->imported = 1;
	m->owner_pid = (pid_t)pid;
	m->memrange_set = 1;
	m->addr = (uintptr_t)addr;
	m->len = (size_t)len;
	m->perms = perms;
	m->max_devs = 1;
	m->ndevs = 1;
	m->devs[0] = dev;
	dev->users++;
	if (user_data != NULL)
		m->user_data = *user_data;
	*mmap = m;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_cap_is_export_pci_supported(const struct doca_devinfo *devinfo,
							     uint8_t *mmap_export)
{
	if (!model_devinfo_is_valid(devinfo) || mmap_export == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*mmap_export = 1;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_mmap_cap_is_create_from_export_pci_supported(const struct doca_devinfo *devinfo,
									 uint8_t *from_export)
{
	if (!model_devinfo_is_valid(devinfo) || from_export == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*from_export = 1;
	return DOCA_SUCCESS;
}

/* ---- buffers ---- */

struct doca_buf {
	uint32_t magic; /* MAGIC_BUF while handed out, 0 while in the inventory */
	struct doca_buf_inventory *inv;
	struct doca_mmap *mmap;
	uintptr_t head;
	size_t len;
	uintptr_t data;
	size_t data_len;
	uint16_t refcount;
	struct doca_buf *next_free;
};

struct doca_buf_inventory {
	uint32_t magic;
	int started;
	size_t n;
	size_t outstanding;
	struct doca_buf *bufs;
	struct doca_buf *free_list;
};

static int model_inv_is_valid(const struct doca_buf_inventory *inv)
{
	return inv != NULL && inv->magic == MAGIC_INVENTORY;
}

static int model_buf_is_valid(const struct doca_buf *buf)
{
	return buf != NULL && buf->magic == MAGIC_BUF;
}

MODEL_API doca_error_t doca_buf_inventory_create(size_t num_elements, struct doca_buf_inventory **inventory)
{
	if (num_elements == 0 || inventory == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_buf_inventory *inv = calloc(1, sizeof(*inv));
	if (inv == NULL)
		return DOCA_ERROR_NO_MEMORY;
	inv->bufs = calloc(num_elements, sizeof(*inv->bufs));
	if (inv->bufs == NULL) {
		free(inv);
		return DOCA_ERROR_NO_MEMORY;
	}
	inv->magic = MAGIC_INVENTORY;
	inv->n = num_elements;
	for (size_t i = num_elements; i > 0; i--) {
		inv->bufs[i - 1].inv = inv;
		inv->bufs[i - 1].next_free = inv->free_list;
		inv->free_list = &inv->bufs[i - 1];
	}
	*inventory = inv;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_inventory_destroy(struct doca_buf_inventory *inventory)
{
	if (!model_inv_is_valid(inventory))
		return DOCA_ERROR_INVALID_VALUE;
	if (inventory->outstanding > 0)
		return DOCA_ERROR_IN_USE; /* buffers not returned [model] */
	inventory->magic = 0;
	free(inventory->bufs);
	free(inventory);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_inventory_start(struct doca_buf_inventory *inventory)
{
	if (!model_inv_is_valid(inventory))
		return DOCA_ERROR_INVALID_VALUE;
	if (inventory->started)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	inventory->started = 1;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_inventory_stop(struct doca_buf_inventory *inventory)
{
	if (!model_inv_is_valid(inventory))
		return DOCA_ERROR_INVALID_VALUE;
	if (!inventory->started)
		return DOCA_ERROR_BAD_STATE; /* [model] */
	if (inventory->outstanding > 0)
		return DOCA_ERROR_IN_USE; /* [model] */
	inventory->started = 0;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_inventory_buf_get_by_args(struct doca_buf_inventory *inventory,
							  struct doca_mmap *mmap, void *addr, size_t len,
							  void *data, size_t data_len, struct doca_buf **buf)
{
	if (!model_inv_is_valid(inventory) || !model_mmap_is_valid(mmap) || buf == NULL || addr == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	/* Both must be started [doc]; the code is the model's. */
	if (!inventory->started || !mmap->started)
		return DOCA_ERROR_BAD_STATE;
	uintptr_t a = (uintptr_t)addr, d = (uintptr_t)data;
	/* [addr, addr+len) inside the mmap, [data, data+data_len) inside
	 * [addr, addr+len) [doc]/[brief]. */
	if (len > mmap->len || a < mmap->addr || a - mmap->addr > mmap->len - len)
		return DOCA_ERROR_INVALID_VALUE;
	if (data_len > len || d < a || d - a > len - data_len)
		return DOCA_ERROR_INVALID_VALUE;
	if (inventory->free_list == NULL)
		return DOCA_ERROR_NO_MEMORY; /* [doc]: inventory empty */
	struct doca_buf *b = inventory->free_list;
	inventory->free_list = b->next_free;
	b->next_free = NULL;
	b->magic = MAGIC_BUF;
	b->mmap = mmap;
	b->head = a;
	b->len = len;
	b->data = d;
	b->data_len = data_len;
	b->refcount = 1;
	inventory->outstanding++;
	mmap->nbufs++;
	*buf = b;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_inc_refcount(struct doca_buf *buf, uint16_t *refcount)
{
	if (!model_buf_is_valid(buf))
		return DOCA_ERROR_INVALID_VALUE;
	if (buf->refcount == UINT16_MAX)
		return DOCA_ERROR_TOO_BIG; /* [model] */
	buf->refcount++;
	if (refcount != NULL)
		*refcount = buf->refcount;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_dec_refcount(struct doca_buf *buf, uint16_t *refcount)
{
	if (!model_buf_is_valid(buf))
		return DOCA_ERROR_INVALID_VALUE; /* includes a buffer already returned */
	buf->refcount--;
	if (refcount != NULL)
		*refcount = buf->refcount;
	if (buf->refcount == 0) {
		/* Back to the inventory [doc]. */
		struct doca_buf_inventory *inv = buf->inv;
		buf->mmap->nbufs--;
		inv->outstanding--;
		buf->magic = 0;
		buf->mmap = NULL;
		buf->next_free = inv->free_list;
		inv->free_list = buf;
	}
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_get_len(const struct doca_buf *buf, size_t *len)
{
	if (!model_buf_is_valid(buf) || len == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*len = buf->len;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_get_head(const struct doca_buf *buf, void **head)
{
	if (!model_buf_is_valid(buf) || head == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*head = (void *)buf->head;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_get_data(const struct doca_buf *buf, void **data)
{
	if (!model_buf_is_valid(buf) || data == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*data = (void *)buf->data;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_get_data_len(const struct doca_buf *buf, size_t *data_len)
{
	if (!model_buf_is_valid(buf) || data_len == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	*data_len = buf->data_len;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_buf_set_data(struct doca_buf *buf, void *data, size_t data_len)
{
	if (!model_buf_is_valid(buf) || data == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	uintptr_t d = (uintptr_t)data;
	/* Must lie inside the buffer [brief]. */
	if (data_len > buf->len || d < buf->head || d - buf->head > buf->len - data_len)
		return DOCA_ERROR_INVALID_VALUE;
	buf->data = d;
	buf->data_len = data_len;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t model_buf_view(const struct doca_buf *buf, uint8_t **data, size_t *data_len,
				      size_t *tail_room)
{
	if (!model_buf_is_valid(buf))
		return DOCA_ERROR_INVALID_VALUE;
	if (data != NULL)
		*data = (uint8_t *)buf->data;
	if (data_len != NULL)
		*data_len = buf->data_len;
	if (tail_room != NULL)
		*tail_room = (buf->head + buf->len) - (buf->data + buf->data_len);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t model_buf_append(struct doca_buf *buf, size_t n)
{
	size_t room;
	if (model_buf_view(buf, NULL, NULL, &room) != DOCA_SUCCESS || n > room)
		return DOCA_ERROR_INVALID_VALUE;
	buf->data_len += n;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t model_buf_check_access(const struct doca_buf *buf, const struct doca_dev *dev, int write)
{
	if (!model_buf_is_valid(buf))
		return DOCA_ERROR_INVALID_VALUE;
	const struct doca_mmap *m = buf->mmap;
	if (dev != NULL) {
		int found = 0;
		for (uint32_t i = 0; i < m->ndevs; i++)
			found |= model_same_device(m->devs[i], dev);
		if (!found)
			return DOCA_ERROR_NOT_PERMITTED; /* [model] */
	}
	if (write) {
		uint32_t need = m->imported ? DOCA_ACCESS_FLAG_PCI_READ_WRITE : DOCA_ACCESS_FLAG_LOCAL_READ_WRITE;
		if ((m->perms & need) == 0)
			return DOCA_ERROR_NOT_PERMITTED; /* [model] */
	}
	return DOCA_SUCCESS;
}

MODEL_API int model_buf_foreign_pid(const struct doca_buf *buf)
{
	if (!model_buf_is_valid(buf))
		return 0;
	const struct doca_mmap *m = buf->mmap;
	/* getpid() at call time: a child forked after the import reaches the
	 * owner (maybe its parent) across processes too. */
	if (!m->imported || m->owner_pid == getpid())
		return 0;
	return (int)m->owner_pid;
}
