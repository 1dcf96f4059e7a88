//! RabbitMQ: the relay's publisher and the consumer runtime's transport.
