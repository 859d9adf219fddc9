-- Paused lanes (schema.sql says why the table and its columns).
CREATE TABLE paused_lanes (
    lane      text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    reason    text,
    CONSTRAINT paused_lanes_lane_format CHECK (lane ~ '^[A-Za-z0-9_]{1,64}$'),
    CONSTRAINT paused_lanes_paused_by_length CHECK (length(paused_by) BETWEEN 1 AND 255),
    CONSTRAINT paused_lanes_reason_length CHECK (length(reason) BETWEEN 1 AND 255)
);
