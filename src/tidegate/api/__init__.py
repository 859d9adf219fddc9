"""HTTP ingress: webhooks in, admission control, sync replies, the runs and admin APIs."""
