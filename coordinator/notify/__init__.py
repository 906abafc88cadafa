"""Notifications: background results and approval requests reach people where they are.

- :mod:`~coordinator.notify.events`: which feed entries are notified, as what (``spawn.finished``,
  ``approval.requested``…), for which channels (the routing rules of
  :mod:`registry.notifications`, and a spawn's own ``notify``);
- :mod:`~coordinator.notify.render`: the bodies: a Slack Block Kit message, the generic webhook's
  versioned JSON;
- :mod:`~coordinator.notify.delivery`: one attempt over HTTP (signed, bounded) and what to do
  after it (done, again later, give up);
- :mod:`~coordinator.notify.sender`: the elected sender: feeds → outbox → deliveries.
"""
