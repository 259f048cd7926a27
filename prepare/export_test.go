package prepare

// Fail records err as the peer's failure, as the endpoint's failure hook does.
func Fail(r *Request, err error) { r.fail(err) }
