// Package natsauth is Tether's NATS identity layer (placeholder doc).
package natsauth
