/* DOCA test model, not NVIDIA code (written from the public API reference): see model.h. */

#include "model.h"

/* ========================================================================
 * libdoca_comch: the model has no Comch [brief]. Every function exists;
 * creation fails with DOCA_ERROR_NOT_SUPPORTED, so no other call can get a
 * valid object.
 * ======================================================================== */

MODEL_API doca_error_t doca_comch_cap_get_max_msg_size(const struct doca_devinfo *devinfo, uint32_t *size)
{
	MODEL_UNUSED(devinfo);
	MODEL_UNUSED(size);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_cap_server_is_supported(const struct doca_devinfo *devinfo)
{
	MODEL_UNUSED(devinfo);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_cap_client_is_supported(const struct doca_devinfo *devinfo)
{
	MODEL_UNUSED(devinfo);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_create(struct doca_dev *dev, struct doca_dev_rep *repr, const char *name,
						struct doca_comch_server **comch_server)
{
	MODEL_UNUSED(dev);
	MODEL_UNUSED(repr);
	MODEL_UNUSED(name);
	if (comch_server != NULL)
		*comch_server = NULL;
	return DOCA_ERROR_NOT_SUPPORTED; /* the model has no Comch */
}

MODEL_API doca_error_t doca_comch_server_destroy(struct doca_comch_server *comch_server)
{
	MODEL_UNUSED(comch_server);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API struct doca_ctx *doca_comch_server_as_ctx(struct doca_comch_server *comch_server)
{
	MODEL_UNUSED(comch_server);
	return NULL;
}

MODEL_API doca_error_t doca_comch_server_set_max_msg_size(struct doca_comch_server *comch_server, uint32_t size)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(size);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_set_recv_queue_size(struct doca_comch_server *comch_server,
							     uint32_t size)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(size);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_task_send_set_conf(struct doca_comch_server *comch_server,
							    doca_comch_task_send_completion_cb_t task_completion_cb,
							    doca_comch_task_send_completion_cb_t task_error_cb,
							    uint32_t num_send_tasks)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(task_completion_cb);
	MODEL_UNUSED(task_error_cb);
	MODEL_UNUSED(num_send_tasks);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_task_send_alloc_init(struct doca_comch_server *comch_server,
							      struct doca_comch_connection *peer, const void *msg,
							      uint32_t len, struct doca_comch_task_send **task)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(peer);
	MODEL_UNUSED(msg);
	MODEL_UNUSED(len);
	if (task != NULL)
		*task = NULL;
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_event_msg_recv_register(struct doca_comch_server *comch_server,
								 doca_comch_event_msg_recv_cb_t recv_event_cb)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(recv_event_cb);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_event_connection_status_changed_register(
	struct doca_comch_server *comch_server, doca_comch_event_connection_status_changed_cb_t connect_event_cb,
	doca_comch_event_connection_status_changed_cb_t disconnect_event_cb)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(connect_event_cb);
	MODEL_UNUSED(disconnect_event_cb);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_server_disconnect(struct doca_comch_server *comch_server,
						    struct doca_comch_connection *connection)
{
	MODEL_UNUSED(comch_server);
	MODEL_UNUSED(connection);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_client_create(struct doca_dev *dev, const char *name,
						struct doca_comch_client **comch_client)
{
	MODEL_UNUSED(dev);
	MODEL_UNUSED(name);
	if (comch_client != NULL)
		*comch_client = NULL;
	return DOCA_ERROR_NOT_SUPPORTED; /* the model has no Comch */
}

MODEL_API doca_error_t doca_comch_client_destroy(struct doca_comch_client *comch_client)
{
	MODEL_UNUSED(comch_client);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API struct doca_ctx *doca_comch_client_as_ctx(struct doca_comch_client *comch_client)
{
	MODEL_UNUSED(comch_client);
	return NULL;
}

MODEL_API doca_error_t doca_comch_client_set_max_msg_size(struct doca_comch_client *comch_client, uint32_t size)
{
	MODEL_UNUSED(comch_client);
	MODEL_UNUSED(size);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_client_set_recv_queue_size(struct doca_comch_client *comch_client,
							     uint32_t size)
{
	MODEL_UNUSED(comch_client);
	MODEL_UNUSED(size);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_client_get_connection(const struct doca_comch_client *comch_client,
							struct doca_comch_connection **connection)
{
	MODEL_UNUSED(comch_client);
	if (connection != NULL)
		*connection = NULL;
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_client_task_send_set_conf(struct doca_comch_client *comch_client,
							    doca_comch_task_send_completion_cb_t task_completion_cb,
							    doca_comch_task_send_completion_cb_t task_error_cb,
							    uint32_t num_send_tasks)
{
	MODEL_UNUSED(comch_client);
	MODEL_UNUSED(task_completion_cb);
	MODEL_UNUSED(task_error_cb);
	MODEL_UNUSED(num_send_tasks);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_client_task_send_alloc_init(struct doca_comch_client *comch_client,
							      struct doca_comch_connection *peer, const void *msg,
							      uint32_t len, struct doca_comch_task_send **task)
{
	MODEL_UNUSED(comch_client);
	MODEL_UNUSED(peer);
	MODEL_UNUSED(msg);
	MODEL_UNUSED(len);
	if (task != NULL)
		*task = NULL;
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API doca_error_t doca_comch_client_event_msg_recv_register(struct doca_comch_client *comch_client,
								 doca_comch_event_msg_recv_cb_t recv_event_cb)
{
	MODEL_UNUSED(comch_client);
	MODEL_UNUSED(recv_event_cb);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API struct doca_task *doca_comch_task_send_as_task(struct doca_comch_task_send *task)
{
	MODEL_UNUSED(task);
	return NULL;
}

MODEL_API doca_error_t doca_comch_connection_set_user_data(struct doca_comch_connection *connection,
							   union doca_data user_data)
{
	MODEL_UNUSED(connection);
	MODEL_UNUSED(user_data);
	return DOCA_ERROR_NOT_SUPPORTED;
}

MODEL_API union doca_data doca_comch_connection_get_user_data(const struct doca_comch_connection *connection)
{
	union doca_data none = { .u64 = 0 };
	MODEL_UNUSED(connection);
	return none;
}
