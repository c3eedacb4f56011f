// Responses the gateway itself cut: the shutdown budget (server.shutdownTimeout) ran out, or the
// connection outlived server.requestTimeout while a body was still arriving, or that body could
// not be parsed. Their connection closes like a client's would; this map lets the forward tell them
// apart, so the access log says what ended them (shutting_down, client_timeout, bad_request), not
// the client (499).
export const cutByGateway = new WeakMap<object, 'shutting_down' | 'client_timeout' | 'bad_request'>()
