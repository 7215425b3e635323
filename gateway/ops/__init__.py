"""Operations: backlog views, alerts, snapshots for reports, metrics and logs."""
