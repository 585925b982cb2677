/*
 * model.h -- an in-process TEST MODEL of the subset of the NVIDIA DOCA 3.x
 * C API that Sluice declares in bindings/doca-sys (libdoca_common,
 * libdoca_dma, libdoca_comch, libdoca_aes_gcm).
 *
 *   THIS IS NOT DOCA AND NOT NVIDIA CODE. It is a test double used by Sluice's
 *   tests, so that the safe wrapper's call sequences can run on machines that
 *   have neither a BlueField nor the DOCA runtime.
 *
 * It was written from NVIDIA's public DOCA API reference and documentation;
 * nothing was copied from DOCA headers, samples or libraries. The types, enum
 * values and signatures below are re-declared from Sluice's own hand-written
 * bindings (bindings/doca-sys/src/{types,error,common,dma,comch,aes_gcm}.rs).
 * No hardware is involved: the one "device" is a constant, DMA is memmove,
 * AES-GCM is OpenSSL's EVP, and all work happens inside this process when the
 * caller runs doca_pe_progress().
 *
 * Cross-process PCI import [brief]: an mmap exported with doca_mmap_export_pci
 * in one process can be imported with doca_mmap_create_from_export in another
 * process of the same user. A DMA memcpy touching such an imported mmap then
 * moves the bytes with process_vm_readv / process_vm_writev, which stands in
 * for the DPU's DMA engine reaching host memory over PCIe (so the kernel must
 * allow it: same uid, no Yama ptrace restriction, no seccomp filter). Imports
 * of this process's own exports keep using memmove. AES-GCM refuses foreign
 * memory (DOCA_ERROR_NOT_SUPPORTED). SLUICE_DOCA_MODEL_SAME_PROCESS_ONLY=1
 * restores the older behaviour: a descriptor from another process is refused
 * with DOCA_ERROR_NOT_PERMITTED. See "cross-process DMA" in dma.c for
 * how failures (exporter gone, range unmapped) map to DOCA errors.
 *
 * Files, and the four libraries doca/model/build.sh builds from them:
 *   model.h          this header: the types, the API prototypes and the model
 *                    internal interface every part shares
 *   common.h, common_dev.c, common_core.c, common_mmap.c
 *                    -> libdoca_common.so  (errors, devices; the progress
 *                       engine, contexts, tasks; mmaps, export/import,
 *                       buffers, inventories: the shared state)
 *   dma.c            -> libdoca_dma.so     (linked against libdoca_common)
 *   comch.c          -> libdoca_comch.so   (every call: "no Comch here")
 *   aes_gcm.c        -> libdoca_aes_gcm.so (linked against libdoca_common
 *                       and libcrypto)
 *   driver.h, driver_*.c -> the scenario driver doca/model/check.sh runs; it
 *                       includes this header with MODEL_DECLS_ONLY defined
 *                       (only the declarations), so the driver and the model
 *                       can never disagree on a prototype
 *
 * The libraries are opened RTLD_LOCAL by doca-sys, so the parts cannot see
 * each other's symbols except through their ELF dependencies: the dma and
 * aes_gcm parts reach the shared state only through the model_* functions
 * exported by libdoca_common (see "Model internal interface" below). Objects
 * are compiled with -fvisibility=hidden; only doca_* API functions and model_*
 * helpers are exported.
 *
 * Where the model's behaviour comes from (marked in the comments at each
 * function):
 *   [doc]   the public DOCA API reference says so;
 *   [brief] Sluice's specification of this model;
 *   [model] a choice made here where the reference is silent. Tests must not
 *           treat a [model] error code as proof of what real DOCA returns.
 *
 * Threading: like DOCA, objects are not thread-safe; a progress engine and its
 * contexts belong to one thread. The model keeps no global mutable state, so
 * independent object graphs may be used from different threads.
 */

#ifndef DOCA_MODEL_H
#define DOCA_MODEL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stddef.h>
#include <stdint.h>

#define MODEL_API __attribute__((visibility("default")))

/* ========================================================================
 * Types (re-declared from bindings/doca-sys/src/types.rs and error.rs)
 * ======================================================================== */

/* DOCA 3.0's error codes, values and names as listed in doca-sys error.rs. */
typedef enum doca_error {
	DOCA_SUCCESS = 0,
	DOCA_ERROR_UNKNOWN = 1,
	DOCA_ERROR_NOT_PERMITTED = 2,
	DOCA_ERROR_IN_USE = 3,
	DOCA_ERROR_NOT_SUPPORTED = 4,
	DOCA_ERROR_AGAIN = 5,
	DOCA_ERROR_INVALID_VALUE = 6,
	DOCA_ERROR_NO_MEMORY = 7,
	DOCA_ERROR_INITIALIZATION = 8,
	DOCA_ERROR_TIME_OUT = 9,
	DOCA_ERROR_SHUTDOWN = 10,
	DOCA_ERROR_CONNECTION_RESET = 11,
	DOCA_ERROR_CONNECTION_ABORTED = 12,
	DOCA_ERROR_CONNECTION_INPROGRESS = 13,
	DOCA_ERROR_NOT_CONNECTED = 14,
	DOCA_ERROR_NO_LOCK = 15,
	DOCA_ERROR_NOT_FOUND = 16,
	DOCA_ERROR_IO_FAILED = 17,
	DOCA_ERROR_BAD_STATE = 18,
	DOCA_ERROR_UNSUPPORTED_VERSION = 19,
	DOCA_ERROR_OPERATING_SYSTEM = 20,
	DOCA_ERROR_DRIVER = 21,
	DOCA_ERROR_UNEXPECTED = 22,
	DOCA_ERROR_ALREADY_EXIST = 23,
	DOCA_ERROR_FULL = 24,
	DOCA_ERROR_EMPTY = 25,
	DOCA_ERROR_IN_PROGRESS = 26,
	DOCA_ERROR_TOO_BIG = 27,
	DOCA_ERROR_AUTHENTICATION = 28,
	DOCA_ERROR_BAD_CONFIG = 29,
	DOCA_ERROR_SKIPPED = 30,
} doca_error_t;

/* union doca_data: 8 bytes, passed by value. */
union doca_data {
	void *ptr;
	uint64_t u64;
};

/* Linux: the progress engine's notification handle is a file descriptor. */
typedef int doca_notification_handle_t;

enum doca_access_flag {
	DOCA_ACCESS_FLAG_LOCAL_READ_ONLY = 0,
	DOCA_ACCESS_FLAG_LOCAL_READ_WRITE = 1 << 0,
	DOCA_ACCESS_FLAG_RDMA_READ = 1 << 1,
	DOCA_ACCESS_FLAG_RDMA_WRITE = 1 << 2,
	DOCA_ACCESS_FLAG_RDMA_ATOMIC = 1 << 3,
	DOCA_ACCESS_FLAG_PCI_READ_ONLY = 1 << 4,
	DOCA_ACCESS_FLAG_PCI_READ_WRITE = 1 << 5,
	DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING = 1 << 6,
};

enum doca_pci_func_type {
	DOCA_PCI_FUNC_TYPE_PF = 0,
	DOCA_PCI_FUNC_TYPE_VF = 1,
	DOCA_PCI_FUNC_TYPE_SF = 2,
};

enum doca_ctx_states {
	DOCA_CTX_STATE_IDLE = 0,
	DOCA_CTX_STATE_STARTING = 1,
	DOCA_CTX_STATE_RUNNING = 2,
	DOCA_CTX_STATE_STOPPING = 3,
};

enum doca_aes_gcm_key_type {
	DOCA_AES_GCM_KEY_128 = 1,
	DOCA_AES_GCM_KEY_256 = 2,
};

#define DOCA_DEVINFO_PCI_ADDR_SIZE 13
#define DOCA_DEVINFO_REP_PCI_ADDR_SIZE 13
#define DOCA_DEVINFO_IBDEV_NAME_SIZE 64

struct doca_devinfo;
struct doca_devinfo_rep;
struct doca_dev;
struct doca_dev_rep;
struct doca_mmap;
struct doca_buf;
struct doca_buf_inventory;
struct doca_pe;
struct doca_ctx;
struct doca_task;
struct doca_dma;
struct doca_dma_task_memcpy;
struct doca_comch_server;
struct doca_comch_client;
struct doca_comch_connection;
struct doca_comch_task_send;
struct doca_comch_event_msg_recv;
struct doca_comch_event_connection_status_changed;
struct doca_aes_gcm;
struct doca_aes_gcm_key;
struct doca_aes_gcm_task_encrypt;
struct doca_aes_gcm_task_decrypt;
struct ibv_pd;

typedef void (*doca_ctx_state_changed_callback_t)(union doca_data user_data, struct doca_ctx *ctx,
						  enum doca_ctx_states prev_state,
						  enum doca_ctx_states next_state);
typedef void (*doca_dma_task_memcpy_completion_cb_t)(struct doca_dma_task_memcpy *task,
						     union doca_data task_user_data,
						     union doca_data ctx_user_data);
typedef void (*doca_comch_task_send_completion_cb_t)(struct doca_comch_task_send *task,
						     union doca_data task_user_data,
						     union doca_data ctx_user_data);
typedef void (*doca_comch_event_msg_recv_cb_t)(struct doca_comch_event_msg_recv *event, uint8_t *recv_buffer,
					       uint32_t msg_len, struct doca_comch_connection *comch_connection);
typedef void (*doca_comch_event_connection_status_changed_cb_t)(
	struct doca_comch_event_connection_status_changed *event, struct doca_comch_connection *comch_connection,
	uint8_t change_successful);
typedef void (*doca_aes_gcm_task_encrypt_completion_cb_t)(struct doca_aes_gcm_task_encrypt *task,
							  union doca_data task_user_data,
							  union doca_data ctx_user_data);
typedef void (*doca_aes_gcm_task_decrypt_completion_cb_t)(struct doca_aes_gcm_task_decrypt *task,
							  union doca_data task_user_data,
							  union doca_data ctx_user_data);

/* ========================================================================
 * API prototypes: exactly the functions doca-sys declares, per library.
 * ======================================================================== */

/* ---- libdoca_common (common.rs) ---- */
MODEL_API const char *doca_error_get_name(doca_error_t error);
MODEL_API const char *doca_error_get_descr(doca_error_t error);
MODEL_API doca_error_t doca_devinfo_create_list(struct doca_devinfo ***dev_list, uint32_t *nb_devs);
MODEL_API doca_error_t doca_devinfo_destroy_list(struct doca_devinfo **dev_list);
MODEL_API doca_error_t doca_devinfo_get_pci_addr_str(const struct doca_devinfo *devinfo, char *pci_addr_str);
MODEL_API doca_error_t doca_devinfo_is_equal_pci_addr(const struct doca_devinfo *devinfo, const char *pci_addr_str,
						      uint8_t *is_equal);
MODEL_API doca_error_t doca_devinfo_get_ibdev_name(const struct doca_devinfo *devinfo, char *ibdev_name,
						   uint32_t size);
MODEL_API doca_error_t doca_dev_open(struct doca_devinfo *devinfo, struct doca_dev **dev);
MODEL_API doca_error_t doca_dev_close(struct doca_dev *dev);
MODEL_API struct doca_devinfo *doca_dev_as_devinfo(const struct doca_dev *dev);
MODEL_API doca_error_t doca_devinfo_rep_create_list(struct doca_dev *dev, int filter,
						    struct doca_devinfo_rep ***dev_list_rep, uint32_t *nb_devs_rep);
MODEL_API doca_error_t doca_devinfo_rep_destroy_list(struct doca_devinfo_rep **dev_list_rep);
MODEL_API doca_error_t doca_devinfo_rep_get_pci_addr_str(const struct doca_devinfo_rep *devinfo_rep,
							 char *pci_addr_str);
MODEL_API doca_error_t doca_devinfo_rep_get_pci_func_type(const struct doca_devinfo_rep *devinfo_rep,
							  enum doca_pci_func_type *pci_func_type);
MODEL_API doca_error_t doca_dev_rep_open(struct doca_devinfo_rep *devinfo, struct doca_dev_rep **dev_rep);
MODEL_API doca_error_t doca_dev_rep_close(struct doca_dev_rep *dev);
MODEL_API doca_error_t doca_mmap_create(struct doca_mmap **mmap);
MODEL_API doca_error_t doca_mmap_destroy(struct doca_mmap *mmap);
MODEL_API doca_error_t doca_mmap_start(struct doca_mmap *mmap);
MODEL_API doca_error_t doca_mmap_stop(struct doca_mmap *mmap);
MODEL_API doca_error_t doca_mmap_add_dev(struct doca_mmap *mmap, struct doca_dev *dev);
MODEL_API doca_error_t doca_mmap_rm_dev(struct doca_mmap *mmap, struct doca_dev *dev);
MODEL_API doca_error_t doca_mmap_set_memrange(struct doca_mmap *mmap, void *addr, size_t len);
MODEL_API doca_error_t doca_mmap_set_dmabuf_memrange(struct doca_mmap *mmap, int dmabuf_fd, void *addr,
						     size_t dmabuf_offset, size_t len);
MODEL_API doca_error_t doca_mmap_get_memrange(const struct doca_mmap *mmap, void **addr, size_t *len);
MODEL_API doca_error_t doca_mmap_set_permissions(struct doca_mmap *mmap, uint32_t access_mask);
MODEL_API doca_error_t doca_mmap_set_max_num_devices(struct doca_mmap *mmap, uint32_t max_num_devices);
MODEL_API doca_error_t doca_mmap_export_pci(struct doca_mmap *mmap, const struct doca_dev *dev,
					    const void **export_desc, size_t *export_desc_len);
MODEL_API doca_error_t doca_mmap_export_rdma(struct doca_mmap *mmap, const struct doca_dev *dev,
					     const void **export_desc, size_t *export_desc_len);
MODEL_API doca_error_t doca_mmap_create_from_export(const union doca_data *user_data, const void *export_desc,
						    size_t export_desc_len, struct doca_dev *dev,
						    struct doca_mmap **mmap);
MODEL_API doca_error_t doca_mmap_cap_is_export_pci_supported(const struct doca_devinfo *devinfo,
							     uint8_t *mmap_export);
MODEL_API doca_error_t doca_mmap_cap_is_create_from_export_pci_supported(const struct doca_devinfo *devinfo,
									 uint8_t *from_export);
MODEL_API doca_error_t doca_buf_inventory_create(size_t num_elements, struct doca_buf_inventory **inventory);
MODEL_API doca_error_t doca_buf_inventory_destroy(struct doca_buf_inventory *inventory);
MODEL_API doca_error_t doca_buf_inventory_start(struct doca_buf_inventory *inventory);
MODEL_API doca_error_t doca_buf_inventory_stop(struct doca_buf_inventory *inventory);
MODEL_API doca_error_t doca_buf_inventory_buf_get_by_args(struct doca_buf_inventory *inventory,
							  struct doca_mmap *mmap, void *addr, size_t len,
							  void *data, size_t data_len, struct doca_buf **buf);
MODEL_API doca_error_t doca_buf_inc_refcount(struct doca_buf *buf, uint16_t *refcount);
MODEL_API doca_error_t doca_buf_dec_refcount(struct doca_buf *buf, uint16_t *refcount);
MODEL_API doca_error_t doca_buf_get_len(const struct doca_buf *buf, size_t *len);
MODEL_API doca_error_t doca_buf_get_head(const struct doca_buf *buf, void **head);
MODEL_API doca_error_t doca_buf_get_data(const struct doca_buf *buf, void **data);
MODEL_API doca_error_t doca_buf_get_data_len(const struct doca_buf *buf, size_t *data_len);
MODEL_API doca_error_t doca_buf_set_data(struct doca_buf *buf, void *data, size_t data_len);
MODEL_API doca_error_t doca_pe_create(struct doca_pe **pe);
MODEL_API doca_error_t doca_pe_destroy(struct doca_pe *pe);
MODEL_API uint8_t doca_pe_progress(struct doca_pe *pe);
MODEL_API doca_error_t doca_pe_connect_ctx(struct doca_pe *pe, struct doca_ctx *ctx);
MODEL_API doca_error_t doca_pe_get_num_inflight_tasks(const struct doca_pe *pe, size_t *num_inflight_tasks);
MODEL_API doca_error_t doca_pe_get_notification_handle(const struct doca_pe *pe,
						       doca_notification_handle_t *handle);
MODEL_API doca_error_t doca_pe_request_notification(struct doca_pe *pe);
MODEL_API doca_error_t doca_pe_clear_notification(struct doca_pe *pe, doca_notification_handle_t handle);
MODEL_API doca_error_t doca_task_submit(struct doca_task *task);
MODEL_API doca_error_t doca_task_try_submit(struct doca_task *task);
MODEL_API void doca_task_free(struct doca_task *task);
MODEL_API doca_error_t doca_task_get_status(const struct doca_task *task);
MODEL_API void doca_task_set_user_data(struct doca_task *task, union doca_data user_data);
MODEL_API union doca_data doca_task_get_user_data(const struct doca_task *task);
MODEL_API doca_error_t doca_ctx_start(struct doca_ctx *ctx);
MODEL_API doca_error_t doca_ctx_stop(struct doca_ctx *ctx);
MODEL_API doca_error_t doca_ctx_get_state(const struct doca_ctx *ctx, enum doca_ctx_states *state);
MODEL_API doca_error_t doca_ctx_set_user_data(struct doca_ctx *ctx, union doca_data user_data);
MODEL_API doca_error_t doca_ctx_get_num_inflight_tasks(const struct doca_ctx *ctx, size_t *num_inflight_tasks);
MODEL_API doca_error_t doca_ctx_set_state_changed_cb(struct doca_ctx *ctx, doca_ctx_state_changed_callback_t cb);
MODEL_API doca_error_t doca_rdma_bridge_get_dev_pd(const struct doca_dev *dev, struct ibv_pd **pd);
MODEL_API doca_error_t doca_rdma_bridge_open_dev_from_pd(struct ibv_pd *pd, struct doca_dev **dev);
MODEL_API doca_error_t doca_rdma_bridge_get_buf_mkey(const struct doca_buf *buf, struct doca_dev *dev,
						     uint32_t *mkey);

/* ---- libdoca_dma (dma.rs) ---- */
MODEL_API doca_error_t doca_dma_create(struct doca_dev *dev, struct doca_dma **dma);
MODEL_API doca_error_t doca_dma_destroy(struct doca_dma *dma);
MODEL_API struct doca_ctx *doca_dma_as_ctx(struct doca_dma *dma);
MODEL_API doca_error_t doca_dma_cap_task_memcpy_is_supported(const struct doca_devinfo *devinfo);
MODEL_API doca_error_t doca_dma_cap_task_memcpy_get_max_buf_size(const struct doca_devinfo *devinfo,
								 uint64_t *buf_size);
MODEL_API doca_error_t doca_dma_task_memcpy_set_conf(struct doca_dma *dma,
						     doca_dma_task_memcpy_completion_cb_t task_completion_cb,
						     doca_dma_task_memcpy_completion_cb_t task_error_cb,
						     uint32_t num_memcpy_tasks);
MODEL_API doca_error_t doca_dma_task_memcpy_alloc_init(struct doca_dma *dma, const struct doca_buf *src,
						       struct doca_buf *dst, union doca_data user_data,
						       struct doca_dma_task_memcpy **task);
MODEL_API struct doca_task *doca_dma_task_memcpy_as_task(struct doca_dma_task_memcpy *task);
MODEL_API const struct doca_buf *doca_dma_task_memcpy_get_src(const struct doca_dma_task_memcpy *task);
MODEL_API struct doca_buf *doca_dma_task_memcpy_get_dst(const struct doca_dma_task_memcpy *task);

/* ---- libdoca_comch (comch.rs) ---- */
MODEL_API doca_error_t doca_comch_cap_get_max_msg_size(const struct doca_devinfo *devinfo, uint32_t *size);
MODEL_API doca_error_t doca_comch_cap_server_is_supported(const struct doca_devinfo *devinfo);
MODEL_API doca_error_t doca_comch_cap_client_is_supported(const struct doca_devinfo *devinfo);
MODEL_API doca_error_t doca_comch_server_create(struct doca_dev *dev, struct doca_dev_rep *repr, const char *name,
						struct doca_comch_server **comch_server);
MODEL_API doca_error_t doca_comch_server_destroy(struct doca_comch_server *comch_server);
MODEL_API struct doca_ctx *doca_comch_server_as_ctx(struct doca_comch_server *comch_server);
MODEL_API doca_error_t doca_comch_server_set_max_msg_size(struct doca_comch_server *comch_server, uint32_t size);
MODEL_API doca_error_t doca_comch_server_set_recv_queue_size(struct doca_comch_server *comch_server,
							     uint32_t size);
MODEL_API doca_error_t doca_comch_server_task_send_set_conf(struct doca_comch_server *comch_server,
							    doca_comch_task_send_completion_cb_t task_completion_cb,
							    doca_comch_task_send_completion_cb_t task_error_cb,
							    uint32_t num_send_tasks);
MODEL_API doca_error_t doca_comch_server_task_send_alloc_init(struct doca_comch_server *comch_server,
							      struct doca_comch_connection *peer, const void *msg,
							      uint32_t len, struct doca_comch_task_send **task);
MODEL_API doca_error_t doca_comch_server_event_msg_recv_register(struct doca_comch_server *comch_server,
								 doca_comch_event_msg_recv_cb_t recv_event_cb);
MODEL_API doca_error_t doca_comch_server_event_connection_status_changed_register(
	struct doca_comch_server *comch_server, doca_comch_event_connection_status_changed_cb_t connect_event_cb,
	doca_comch_event_connection_status_changed_cb_t disconnect_event_cb);
MODEL_API doca_error_t doca_comch_server_disconnect(struct doca_comch_server *comch_server,
						    struct doca_comch_connection *connection);
MODEL_API doca_error_t doca_comch_client_create(struct doca_dev *dev, const char *name,
						struct doca_comch_client **comch_client);
MODEL_API doca_error_t doca_comch_client_destroy(struct doca_comch_client *comch_client);
MODEL_API struct doca_ctx *doca_comch_client_as_ctx(struct doca_comch_client *comch_client);
MODEL_API doca_error_t doca_comch_client_set_max_msg_size(struct doca_comch_client *comch_client, uint32_t size);
MODEL_API doca_error_t doca_comch_client_set_recv_queue_size(struct doca_comch_client *comch_client,
							     uint32_t size);
MODEL_API doca_error_t doca_comch_client_get_connection(const struct doca_comch_client *comch_client,
							struct doca_comch_connection **connection);
MODEL_API doca_error_t doca_comch_client_task_send_set_conf(struct doca_comch_client *comch_client,
							    doca_comch_task_send_completion_cb_t task_completion_cb,
							    doca_comch_task_send_completion_cb_t task_error_cb,
							    uint32_t num_send_tasks);
MODEL_API doca_error_t doca_comch_client_task_send_alloc_init(struct doca_comch_client *comch_client,
							      struct doca_comch_connection *peer, const void *msg,
							      uint32_t len, struct doca_comch_task_send **task);
MODEL_API doca_error_t doca_comch_client_event_msg_recv_register(struct doca_comch_client *comch_client,
								 doca_comch_event_msg_recv_cb_t recv_event_cb);
MODEL_API struct doca_task *doca_comch_task_send_as_task(struct doca_comch_task_send *task);
MODEL_API doca_error_t doca_comch_connection_set_user_data(struct doca_comch_connection *connection,
							   union doca_data user_data);
MODEL_API union doca_data doca_comch_connection_get_user_data(const struct doca_comch_connection *connection);

/* ---- libdoca_aes_gcm (aes_gcm.rs) ---- */
MODEL_API doca_error_t doca_aes_gcm_create(struct doca_dev *dev, struct doca_aes_gcm **aes_gcm);
MODEL_API doca_error_t doca_aes_gcm_destroy(struct doca_aes_gcm *aes_gcm);
MODEL_API struct doca_ctx *doca_aes_gcm_as_ctx(struct doca_aes_gcm *aes_gcm);
MODEL_API doca_error_t doca_aes_gcm_cap_task_encrypt_is_supported(const struct doca_devinfo *devinfo);
MODEL_API doca_error_t doca_aes_gcm_cap_task_decrypt_is_supported(const struct doca_devinfo *devinfo);
MODEL_API doca_error_t doca_aes_gcm_key_create(struct doca_aes_gcm *aes_gcm, const void *raw_key,
					       enum doca_aes_gcm_key_type raw_key_type,
					       struct doca_aes_gcm_key **key);
MODEL_API doca_error_t doca_aes_gcm_key_destroy(struct doca_aes_gcm_key *key);
MODEL_API doca_error_t doca_aes_gcm_task_encrypt_set_conf(struct doca_aes_gcm *aes_gcm,
							  doca_aes_gcm_task_encrypt_completion_cb_t task_completion_cb,
							  doca_aes_gcm_task_encrypt_completion_cb_t task_error_cb,
							  uint32_t num_tasks);
MODEL_API doca_error_t doca_aes_gcm_task_encrypt_alloc_init(struct doca_aes_gcm *aes_gcm,
							    const struct doca_buf *src_buff, struct doca_buf *dst_buff,
							    struct doca_aes_gcm_key *key, const uint8_t *iv,
							    uint32_t iv_length, uint32_t tag_size, uint32_t aad_size,
							    union doca_data user_data,
							    struct doca_aes_gcm_task_encrypt **task);
MODEL_API struct doca_task *doca_aes_gcm_task_encrypt_as_task(struct doca_aes_gcm_task_encrypt *task);
MODEL_API doca_error_t doca_aes_gcm_task_decrypt_set_conf(struct doca_aes_gcm *aes_gcm,
							  doca_aes_gcm_task_decrypt_completion_cb_t task_completion_cb,
							  doca_aes_gcm_task_decrypt_completion_cb_t task_error_cb,
							  uint32_t num_tasks);
MODEL_API doca_error_t doca_aes_gcm_task_decrypt_alloc_init(struct doca_aes_gcm *aes_gcm,
							    const struct doca_buf *src_buff, struct doca_buf *dst_buff,
							    struct doca_aes_gcm_key *key, const uint8_t *iv,
							    uint32_t iv_length, uint32_t tag_size, uint32_t aad_size,
							    union doca_data user_data,
							    struct doca_aes_gcm_task_decrypt **task);
MODEL_API struct doca_task *doca_aes_gcm_task_decrypt_as_task(struct doca_aes_gcm_task_decrypt *task);

/* ========================================================================
 * Model internal interface: exported by libdoca_common, used by the dma and
 * aes_gcm parts. Not DOCA API; prefixed model_.
 * ======================================================================== */

/* The export descriptor the model hands out (owned by the exporting mmap):
 *   0..8   magic "DOCAMDL1"
 *   8..16  pid of the process owning the memory (u64, native endian): the
 *          exporting process, or for the RDMA re-export of an imported mmap
 *          the process that exported it over PCI
 *   16..24 first byte of the range (u64)
 *   24..32 length of the range (u64)
 *   32..36 access flags of the exporting mmap (u32)
 *   36..40 kind (u32): MODEL_EXPORT_KIND_PCI or MODEL_EXPORT_KIND_RDMA */
#define MODEL_EXPORT_MAGIC "DOCAMDL1"
#define MODEL_EXPORT_LEN 40u
#define MODEL_EXPORT_KIND_PCI 1u
#define MODEL_EXPORT_KIND_RDMA 2u

/* Largest buffer a DMA memcpy task moves (doca_dma_cap_task_memcpy_get_max_buf_size). */
#define MODEL_DMA_MAX_BUF_SIZE (UINT64_C(2) << 30)

#define MODEL_MAX_TASK_TYPES 2u

/* Every library's typed completion callback has this shape (task pointer,
 * task user data, ctx user data); the task pointer is the doca_task itself. */
typedef void (*model_task_cb)(void *task, union doca_data task_user_data, union doca_data ctx_user_data);

/* What a library part plugs into the generic context. */
struct model_ctx_ops {
	const char *name;
	/* doca_ctx_start: DOCA_SUCCESS when the library is configured. */
	doca_error_t (*can_start)(void *impl);
	/* doca_task_try_submit: DOCA_SUCCESS if the task could run. */
	doca_error_t (*validate)(void *impl, struct doca_task *task, unsigned type, void *payload);
	/* doca_pe_progress: run the task, return its status. */
	doca_error_t (*execute)(void *impl, struct doca_task *task, unsigned type, void *payload);
};

MODEL_API doca_error_t model_ctx_create(struct doca_dev *dev, const struct model_ctx_ops *ops, void *impl,
					unsigned n_task_types, struct doca_ctx **ctx);
MODEL_API doca_error_t model_ctx_destroy(struct doca_ctx *ctx);
MODEL_API struct doca_dev *model_ctx_dev(const struct doca_ctx *ctx);
MODEL_API doca_error_t model_ctx_set_task_conf(struct doca_ctx *ctx, unsigned type, model_task_cb completion_cb,
					       model_task_cb error_cb, uint32_t num_tasks);
MODEL_API int model_ctx_task_configured(const struct doca_ctx *ctx, unsigned type);
MODEL_API doca_error_t model_task_alloc(struct doca_ctx *ctx, unsigned type, size_t payload_size,
					union doca_data user_data, struct doca_task **task, void **payload);
/* The payload of `task` if it was allocated by a context with `ops` as a task
 * of `type`, else NULL. */
MODEL_API void *model_task_payload(const struct doca_task *task, const struct model_ctx_ops *ops, unsigned type);
MODEL_API int model_dev_is_valid(const struct doca_dev *dev);
MODEL_API int model_devinfo_is_valid(const struct doca_devinfo *devinfo);
/* A buffer's valid bytes and the free room after them (up to head + len). */
MODEL_API doca_error_t model_buf_view(const struct doca_buf *buf, uint8_t **data, size_t *data_len,
				      size_t *tail_room);
/* data_len += n (n must fit in the tail room). */
MODEL_API doca_error_t model_buf_append(struct doca_buf *buf, size_t n);
/* Whether `dev` may read (write = 0) or write (write = 1) `buf`'s memory:
 * the device must be registered with the buffer's mmap, and writing needs
 * LOCAL_READ_WRITE (local mmap) or PCI_READ_WRITE (mmap imported from PCI). */
MODEL_API doca_error_t model_buf_check_access(const struct doca_buf *buf, const struct doca_dev *dev, int write);
/* The pid of the process owning `buf`'s memory if that is ANOTHER process (the
 * buffer lies in an mmap imported from a foreign PCI export), else 0: the
 * memory is this process's own and can be dereferenced. */
MODEL_API int model_buf_foreign_pid(const struct doca_buf *buf);

#ifndef MODEL_DECLS_ONLY

#include <stdlib.h>
#include <string.h>

#define MODEL_UNUSED(x) ((void)(x))

/* Tags at the start of every object, so a wrong or freed handle is reported
 * as DOCA_ERROR_INVALID_VALUE instead of being used (best effort: reading a
 * freed object is still undefined behaviour). */
#define MAGIC_DEVINFO 0x4d444931u
#define MAGIC_DEV 0x4d444556u
#define MAGIC_MMAP 0x4d4d4150u
#define MAGIC_INVENTORY 0x4d494e56u
#define MAGIC_BUF 0x4d425546u
#define MAGIC_PE 0x4d504521u
#define MAGIC_CTX 0x4d435458u
#define MAGIC_TASK 0x4d54534bu
#define MAGIC_DMA 0x4d444d41u
#define MAGIC_AES 0x4d414553u
#define MAGIC_AES_KEY 0x4d414b59u

#endif /* !MODEL_DECLS_ONLY */

#endif /* DOCA_MODEL_H */
