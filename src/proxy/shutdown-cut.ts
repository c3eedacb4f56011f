// Responses the gateway itself cut because the shutdown budget (server.shutdownTimeout) ran out.
// Their connection closes like a client's would; this set lets the forward tell the two apart,
// so the access log says the gateway ended them (shutting_down), not the client (499).
export const cutByShutdown = new WeakSet<object>()
