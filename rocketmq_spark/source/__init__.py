"""The Spark side: a Python data source named ``rocketmq`` (see :mod:`.datasource`)."""
