/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */

#include "common.h"

#include <stdio.h>

/* ========================================================================
 * libdoca_common: errors, devices, representors, RDMA bridge
 * (the rest of libdoca_common: common_core.c, common_mmap.c)
 * ======================================================================== */

/* ---- errors (names exactly as doca-sys error.rs; descriptions are the
 * model's own wording) ---- */

static const struct {
	const char *name;
	const char *descr;
} model_errors[] = {
	{ "DOCA_SUCCESS", "Success" },
	{ "DOCA_ERROR_UNKNOWN", "Unknown error" },
	{ "DOCA_ERROR_NOT_PERMITTED", "Operation not permitted" },
	{ "DOCA_ERROR_IN_USE", "Resource in use" },
	{ "DOCA_ERROR_NOT_SUPPORTED", "Operation not supported" },
	{ "DOCA_ERROR_AGAIN", "Resource temporarily unavailable, try again" },
	{ "DOCA_ERROR_INVALID_VALUE", "Invalid input" },
	{ "DOCA_ERROR_NO_MEMORY", "Out of memory or out of pool elements" },
	{ "DOCA_ERROR_INITIALIZATION", "Initialization failed" },
	{ "DOCA_ERROR_TIME_OUT", "Timed out" },
	{ "DOCA_ERROR_SHUTDOWN", "Shut down in progress" },
	{ "DOCA_ERROR_CONNECTION_RESET", "Connection reset by peer" },
	{ "DOCA_ERROR_CONNECTION_ABORTED", "Connection aborted" },
	{ "DOCA_ERROR_CONNECTION_INPROGRESS", "Connection in progress" },
	{ "DOCA_ERROR_NOT_CONNECTED", "Not connected" },
	{ "DOCA_ERROR_NO_LOCK", "Could not take a lock" },
	{ "DOCA_ERROR_NOT_FOUND", "Not found" },
	{ "DOCA_ERROR_IO_FAILED", "Input/output failure" },
	{ "DOCA_ERROR_BAD_STATE", "Object in the wrong state for this call" },
	{ "DOCA_ERROR_UNSUPPORTED_VERSION", "Unsupported version" },
	{ "DOCA_ERROR_OPERATING_SYSTEM", "Operating system call failed" },
	{ "DOCA_ERROR_DRIVER", "Driver call failed" },
	{ "DOCA_ERROR_UNEXPECTED", "Unexpected condition" },
	{ "DOCA_ERROR_ALREADY_EXIST", "Already exists" },
	{ "DOCA_ERROR_FULL", "Full" },
	{ "DOCA_ERROR_EMPTY", "Empty" },
	{ "DOCA_ERROR_IN_PROGRESS", "Operation still in progress" },
	{ "DOCA_ERROR_TOO_BIG", "Too big" },
	{ "DOCA_ERROR_AUTHENTICATION", "Authentication failed" },
	{ "DOCA_ERROR_BAD_CONFIG", "Invalid configuration" },
	{ "DOCA_ERROR_SKIPPED", "Result valid but earlier output was dropped" },
};

#define MODEL_NUM_ERRORS (sizeof(model_errors) / sizeof(model_errors[0]))

MODEL_API const char *doca_error_get_name(doca_error_t error)
{
	if ((unsigned)error < MODEL_NUM_ERRORS)
		return model_errors[error].name;
	return "DOCA_ERROR_UNRECOGNIZED"; /* [model] */
}

MODEL_API const char *doca_error_get_descr(doca_error_t error)
{
	if ((unsigned)error < MODEL_NUM_ERRORS)
		return model_errors[error].descr;
	return "Unrecognized DOCA error code (DOCA test model)";
}

/* ---- devices ---- */

struct doca_devinfo {
	uint32_t magic;
	const char *pci;
	const char *ibdev;
};

/* The one modelled device [brief]. Read-only after load. */
static struct doca_devinfo model_dev0 = { MAGIC_DEVINFO, "0000:03:00.0", "mlx5_0" };

static unsigned model_num_devices(void)
{
	/* SLUICE_DOCA_MODEL_DEVICES=0 -> no devices [brief]. */
	const char *v = getenv("SLUICE_DOCA_MODEL_DEVICES");
	return (v != NULL && strcmp(v, "0") == 0) ? 0u : 1u;
}

MODEL_API int model_devinfo_is_valid(const struct doca_devinfo *devinfo)
{
	return devinfo != NULL && devinfo->magic == MAGIC_DEVINFO;
}

MODEL_API int model_dev_is_valid(const struct doca_dev *dev)
{
	return dev != NULL && dev->magic == MAGIC_DEV;
}

MODEL_API doca_error_t doca_devinfo_create_list(struct doca_devinfo ***dev_list, uint32_t *nb_devs)
{
	if (dev_list == NULL || nb_devs == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	unsigned n = model_num_devices();
	/* NULL-terminated, even when empty, so destroy_list always has
	 * something to free. An empty list is DOCA_SUCCESS with 0 [model]. */
	struct doca_devinfo **list = calloc(n + 1, sizeof(*list));
	if (list == NULL)
		return DOCA_ERROR_NO_MEMORY;
	if (n > 0)
		list[0] = &model_dev0;
	*dev_list = list;
	*nb_devs = n;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_devinfo_destroy_list(struct doca_devinfo **dev_list)
{
	if (dev_list == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	/* Devinfos stay valid for devices opened from the list [doc]. */
	free(dev_list);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_devinfo_get_pci_addr_str(const struct doca_devinfo *devinfo, char *pci_addr_str)
{
	if (!model_devinfo_is_valid(devinfo) || pci_addr_str == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	/* "DDDD:BB:DD.F" + NUL = DOCA_DEVINFO_PCI_ADDR_SIZE bytes. */
	snprintf(pci_addr_str, DOCA_DEVINFO_PCI_ADDR_SIZE, "%s", devinfo->pci);
	return DOCA_SUCCESS;
}

static int model_hex(const char *s, size_t n, unsigned *out)
{
	unsigned v = 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		unsigned d;
		if (c >= '0' && c <= '9')
			d = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			d = (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			d = (unsigned)(c - 'A' + 10);
		else
			return 0;
		v = v * 16 + d;
	}
	*out = v;
	return 1;
}

/* "DDDD:BB:DD.F" or "BB:DD.F" (domain 0). */
static int model_parse_pci(const char *s, unsigned out[4])
{
	size_t len = strnlen(s, 16);
	const char *p = s;
	if (len == 12) {
		if (!model_hex(p, 4, &out[0]) || p[4] != ':')
			return 0;
		p += 5;
	} else if (len == 7) {
		out[0] = 0;
	} else {
		return 0;
	}
	if (!model_hex(p, 2, &out[1]) || p[2] != ':' || !model_hex(p + 3, 2, &out[2]) || p[5] != '.' ||
	    !model_hex(p + 6, 1, &out[3]) || out[3] > 7)
		return 0;
	return 1;
}

MODEL_API doca_error_t doca_devinfo_is_equal_pci_addr(const struct doca_devinfo *devinfo, const char *pci_addr_str,
						      uint8_t *is_equal)
{
	unsigned want[4], have[4];
	if (!model_devinfo_is_valid(devinfo) || pci_addr_str == NULL || is_equal == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	/* Both "0000:03:00.0" and "03:00.0" name the device [brief]; a string
	 * that is no PCI address is INVALID_VALUE [model]. */
	if (!model_parse_pci(pci_addr_str, want) || !model_parse_pci(devinfo->pci, have))
		return DOCA_ERROR_INVALID_VALUE;
	*is_equal = (uint8_t)(memcmp(want, have, sizeof(want)) == 0);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_devinfo_get_ibdev_name(const struct doca_devinfo *devinfo, char *ibdev_name,
						   uint32_t size)
{
	if (!model_devinfo_is_valid(devinfo) || ibdev_name == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	size_t need = strlen(devinfo->ibdev) + 1;
	if (size < need) /* too small for the name [model] */
		return DOCA_ERROR_INVALID_VALUE;
	memcpy(ibdev_name, devinfo->ibdev, need);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_dev_open(struct doca_devinfo *devinfo, struct doca_dev **dev)
{
	if (!model_devinfo_is_valid(devinfo) || dev == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_dev *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return DOCA_ERROR_NO_MEMORY;
	d->magic = MAGIC_DEV;
	d->info = devinfo;
	*dev = d;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_dev_close(struct doca_dev *dev)
{
	if (!model_dev_is_valid(dev))
		return DOCA_ERROR_INVALID_VALUE;
	/* Still registered with an mmap or used by a context [model]. */
	if (dev->users > 0)
		return DOCA_ERROR_IN_USE;
	dev->magic = 0;
	free(dev);
	return DOCA_SUCCESS;
}

MODEL_API struct doca_devinfo *doca_dev_as_devinfo(const struct doca_dev *dev)
{
	return model_dev_is_valid(dev) ? dev->info : NULL;
}

int model_same_device(const struct doca_dev *a, const struct doca_dev *b)
{
	return a != NULL && b != NULL && a->info == b->info;
}

/* ---- representors: the model has none [brief] ---- */

MODEL_API doca_error_t doca_devinfo_rep_create_list(struct doca_dev *dev, int filter,
						    struct doca_devinfo_rep ***dev_list_rep, uint32_t *nb_devs_rep)
{
	MODEL_UNUSED(filter);
	if (!model_dev_is_valid(dev) || dev_list_rep == NULL || nb_devs_rep == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	struct doca_devinfo_rep **list = calloc(1, sizeof(*list));
	if (list == NULL)
		return DOCA_ERROR_NO_MEMORY;
	*dev_list_rep = list;
	*nb_devs_rep = 0;
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_devinfo_rep_destroy_list(struct doca_devinfo_rep **dev_list_rep)
{
	if (dev_list_rep == NULL)
		return DOCA_ERROR_INVALID_VALUE;
	free(dev_list_rep);
	return DOCA_SUCCESS;
}

MODEL_API doca_error_t doca_devinfo_rep_get_pci_addr_str(const struct doca_devinfo_rep *devinfo_rep,
							 char *pci_addr_str)
{
	MODEL_UNUSED(devinfo_rep);
	MODEL_UNUSED(pci_addr_str);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_devinfo_rep_get_pci_func_type(const struct doca_devinfo_rep *devinfo_rep,
							  enum doca_pci_func_type *pci_func_type)
{
	MODEL_UNUSED(devinfo_rep);
	MODEL_UNUSED(pci_func_type);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_dev_rep_open(struct doca_devinfo_rep *devinfo, struct doca_dev_rep **dev_rep)
{
	MODEL_UNUSED(devinfo);
	if (dev_rep != NULL)
		*dev_rep = NULL;
	return DOCA_ERROR_NOT_FOUND; /* [brief] */
}

MODEL_API doca_error_t doca_dev_rep_close(struct doca_dev_rep *dev)
{
	MODEL_UNUSED(dev);
	return DOCA_ERROR_NOT_SUPPORTED;
}

/* ---- RDMA bridge: no verbs in the model [brief] ---- */

MODEL_API doca_error_t doca_rdma_bridge_get_dev_pd(const struct doca_dev *dev, struct ibv_pd **pd)
{
	MODEL_UNUSED(dev);
	if (pd != NULL)
		*pd = NULL;
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_rdma_bridge_open_dev_from_pd(struct ibv_pd *pd, struct doca_dev **dev)
{
	MODEL_UNUSED(pd);
	if (dev != NULL)
		*dev = NULL;
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_rdma_bridge_get_buf_mkey(const struct doca_buf *buf, struct doca_dev *dev,
						     uint32_t *mkey)
{
	MODEL_UNUSED(buf);
	MODEL_UNUSED(dev);
	MODEL_UNUSED(mkey);
	return DOCA_ERROR_NOT_SUPPORTED;
}
